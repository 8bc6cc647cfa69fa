"""Linear-time scans for the two shapes whose natural regexes are quadratic on long runs of
their characters: JSON Web Tokens and e-mail addresses.  Each yields (start, end, value_start,
value_end) spans (catalog/detectors.py), the value being the whole match."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gnq_core.catalog.detectors import Span

# Two shapes are found by the scans below rather than by a regex: as regexes (a JSON Web Token
# ``\beyJ[T]{8,}\.eyJ[T]{8,}\.[T]{8,}``, an e-mail address ``\b[L]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b``)
# Python's engine retries every word boundary of a long run of T or L characters and rescans the
# run from each: quadratic ("ab-ab-ab-…", 600 KB, took minutes).  The scans find the same matches
# in one pass: within one run every start reaches the same run end, so only the first can match.
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_\-]*")
_JWT_HEAD = re.compile(r"\beyJ")
_JWT_TAIL = re.compile(r"\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")
_EMAIL_LOCAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
_EMAIL_DOMAIN = re.compile(r"@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")
_WORD = re.compile(r"\w")


def jwts(text: str) -> Iterator[Span]:
    """(start, end) of each JSON Web Token, as the regex above finds them, in one pass."""
    resume, run_end, tail = 0, -1, None
    for head in _JWT_HEAD.finditer(text):
        start = head.start()
        if start < resume:
            continue
        if start >= run_end:  # a new run of token characters: its end and what follows it, once
            run_end = _TOKEN_RUN.match(text, start + 3).end()
            tail = _JWT_TAIL.match(text, run_end)
        if tail is not None and run_end - start - 3 >= 8:
            yield start, tail.end(), start, tail.end()
            resume = tail.end()


def _boundary(text: str, i: int) -> bool:
    """Whether ``\\b`` matches at ``i`` (Python's Unicode word characters)."""
    before = i > 0 and _WORD.match(text, i - 1) is not None
    return before != (i < len(text) and _WORD.match(text, i) is not None)


def emails(text: str) -> Iterator[Span]:
    """(start, end) of each e-mail address, as the regex above finds them, in one pass: per "@"
    with a domain after it, the run of local-part characters before it, from its first word
    boundary not inside the previous address."""
    resume = 0
    for domain in _EMAIL_DOMAIN.finditer(text):
        at = domain.start()
        run = at
        while run > resume and text[run - 1] in _EMAIL_LOCAL:  # runs before two "@" never overlap
            run -= 1
        start = next((i for i in range(run, at) if _boundary(text, i)), None)
        if start is not None:
            yield start, domain.end(), start, domain.end()
            resume = domain.end()


