"""How a secret kind is found in a text: a ``Detector`` is a regular expression (its first group
the value, else the whole match) or a scan (a function yielding spans), with an optional check
on the value found (a checksum, a numbering plan).  The catalog's entries (catalog/kinds.py)
list theirs; sources/secrets.py runs them all."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# (start, end) of the whole match (the words announcing the value included), then the value's own
Span = tuple[int, int, int, int]


@dataclass(frozen=True)
class Detector:
    pattern: re.Pattern[str] | None = None
    scan: Callable[[str], Iterator[Span]] | None = None
    valid: Callable[[str], bool] | None = None  # on the value found: False drops the match

    def spans(self, text: str) -> Iterator[Span]:
        """Every (start, end, value_start, value_end) this detector finds in ``text``, unchecked."""
        if self.scan is not None:
            yield from self.scan(text)
            return
        assert self.pattern is not None
        group = 1 if self.pattern.groups else 0
        for m in self.pattern.finditer(text):
            yield m.start(), m.end(), m.start(group), m.end(group)


def regex(source: str, valid: Callable[[str], bool] | None = None, flags: int = 0) -> Detector:
    return Detector(pattern=re.compile(source, flags), valid=valid)


def scan(function: Callable[[str], Iterator[Span]], valid: Callable[[str], bool] | None = None) -> Detector:
    return Detector(scan=function, valid=valid)
