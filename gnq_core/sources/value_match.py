"""How much of a secret-like value a model wrote: the value's own sequence of letters and digits
against the letters and digits written in its place, separators ignored on both sides.

Lined up by character position, a card number written without its spaces ("4539148803436467"
for "4539 1488 0343 6467") scored 5 of 16 by chance, and one written with a space more scored
whatever its shift left; as sequences it is 16 of 16.  A value written whole in another form is
the value; a complete value with other characters ("7399" for the PIN "7319") is a *different*
value that shares some characters with it, and is said so (``ValueMatch.different``).
"""

from __future__ import annotations

from dataclasses import dataclass


def significant(text: str) -> str:
    """The letters and digits of ``text``, in order (what a value is made of; separators dropped)."""
    return "".join(c for c in text if c.isalnum())


@dataclass(frozen=True)
class ValueMatch:
    value: str                # the value's letters and digits
    written: str              # the letters and digits written in its place (at most as many)
    places: tuple[int, ...]   # indices of the value's letters and digits the writing has at their place
    written_text: str = ""    # the written characters as written, separators included ("7399", "4539 1488")

    @property
    def chars(self) -> int:
        return len(self.value)

    @property
    def hits(self) -> int:
        return len(self.places)

    @property
    def whole(self) -> bool:
        return self.chars > 0 and self.hits == self.chars

    @property
    def different(self) -> bool:
        """A complete value of the same form that is not this one (a wrong PIN, another card): as
        many letters and digits, a digit wherever the value has one ("73an" for "7319" is two
        digits and a word, not another PIN)."""
        same_form = all(a.isdigit() == b.isdigit() for a, b in zip(self.value, self.written, strict=False))
        return len(self.written) == self.chars > 0 and same_form and not self.whole


def compare(value: str, written: str, skip: int = 0) -> ValueMatch:
    """``value`` against ``written`` (what the model wrote from the value's first character on),
    both as sequences of letters and digits; ``skip``: letters and digits of ``written`` that
    come before the value's place."""
    mine = significant(value)
    at = [i for i, c in enumerate(written) if c.isalnum()][skip: skip + len(mine)]
    theirs = "".join(written[i] for i in at)
    places = tuple(j for j, c in enumerate(mine) if j < len(theirs) and theirs[j] == c)
    return ValueMatch(mine, theirs, places, written[at[0]: at[-1] + 1] if at else "")


def written_in_place(value: str, target_text: str, generated_text: str) -> ValueMatch:
    """``compare`` for a generation that replaced ``target_text`` (the decoded tokens that hold
    the value, which may begin with characters before it, as " 4821" or "=4821"): the letters and
    digits that come before the value in ``target_text`` are skipped in the generation too.  A
    tokenizer that normalises the text (the value not found as such) skips none."""
    off = target_text.find(value)
    return compare(value, generated_text, len(significant(target_text[:off])) if off > 0 else 0)
