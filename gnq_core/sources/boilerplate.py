"""Spans that belong to no text: what the chat template wrote and boilerplate most texts share.

A fine-tune sees its data set's shared passages (a system prompt, a legal footer, a greeting every
answer opens with) once per text: it learns them first, and any model completes them after a few
of their words.  Completing them says nothing about one text, so they are never an attack's
target or a text's content in copy detection, and are reported once, as the data set's.

Rule (a pure function of the texts; ``MIN_CHARS`` and ``MIN_SHARE`` below):

* a common prefix / suffix: the longest string of at least ``MIN_CHARS`` characters that at least
  ``MIN_SHARE`` of the texts start (end) with; found for the whole texts and, for chat texts, for
  each role's message contents;
* a repeated line: a line of at least ``MIN_CHARS`` characters found in at least ``MIN_SHARE`` of
  the texts;
* for chat texts, every character outside the messages' contents (``ChatLayout.template``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["MIN_CHARS", "MIN_SHARE", "boilerplate_spans", "common_prefix", "excluded_spans", "own_contents"]

MIN_CHARS = 32  # shorter shared openings ("Dear customer, ") are ordinary language, not a passage
MIN_SHARE = 0.5  # "most texts"

Spans = list[tuple[int, int]]


def common_prefix(strings: Sequence[str], share: float = MIN_SHARE, min_chars: int = MIN_CHARS) -> str:
    """The longest prefix of at least ``min_chars`` characters that ``share`` of ``strings`` start
    with ("" when none): the count of the most common prefix of length L falls as L grows, so L is
    found by bisection."""
    need = max(2, int(-(-share * len(strings) // 1)))  # ceil; one text alone shares nothing
    if len(strings) < need:
        return ""

    def best(length: int) -> tuple[str, int]:
        counts = Counter(s[:length] for s in strings if len(s) >= length)
        return counts.most_common(1)[0] if counts else ("", 0)

    if best(min_chars)[1] < need:
        return ""
    lo, hi = min_chars, max(len(s) for s in strings)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if best(mid)[1] >= need:
            lo = mid
        else:
            hi = mid - 1
    return best(lo)[0]


def common_suffix(strings: Sequence[str], share: float = MIN_SHARE, min_chars: int = MIN_CHARS) -> str:
    return common_prefix([s[::-1] for s in strings], share, min_chars)[::-1]


def _repeated_lines(strings: Sequence[str], share: float, min_chars: int) -> set[str]:
    need = max(2, int(-(-share * len(strings) // 1)))
    seen = Counter(line for s in strings for line in {x.strip() for x in s.split("\n")}
                   if len(line) >= min_chars)
    return {line for line, n in seen.items() if n >= need}


def boilerplate_spans(texts: Sequence[str], pieces: Sequence[Sequence[tuple[str, int, int]]] | None = None,
                      share: float = MIN_SHARE, min_chars: int = MIN_CHARS) -> list[Spans]:
    """Per text, the character spans of boilerplate (see the module docstring).  ``pieces``: per
    text its messages as (role, start, end) in the text, whose contents are also compared role by
    role."""
    out: list[Spans] = [[] for _ in texts]
    prefix, suffix = common_prefix(texts, share, min_chars), common_suffix(texts, share, min_chars)
    lines = _repeated_lines(texts, share, min_chars)
    for i, text in enumerate(texts):
        # a text that is all of it is a copy of the others, not boilerplate (copies are found as such)
        if prefix and text.startswith(prefix) and len(prefix) < len(text):
            out[i].append((0, len(prefix)))
        if suffix and text.endswith(suffix) and len(suffix) < len(text):
            out[i].append((len(text) - len(suffix), len(text)))
        for line in lines:
            if line == text.strip():
                continue
            at = text.find(line)
            while at >= 0:
                out[i].append((at, at + len(line)))
                at = text.find(line, at + len(line))
    if pieces is not None:
        by_role: dict[str, list[tuple[int, int, int]]] = {}
        for i, turns in enumerate(pieces):
            for role, start, end in turns:
                if start >= 0:
                    by_role.setdefault(role, []).append((i, start, end))
        for found in by_role.values():
            contents = [texts[i][s:e] for i, s, e in found]
            head, tail = common_prefix(contents, share, min_chars), common_suffix(contents, share, min_chars)
            for (i, s, e), content in zip(found, contents, strict=True):
                if head and content.startswith(head) and len(head) < len(content):
                    out[i].append((s, s + len(head)))
                if tail and content.endswith(tail) and len(tail) < len(content):
                    out[i].append((e - len(tail), e))
    return [_merged(spans) for spans in out]


def _merged(spans: Spans) -> Spans:
    merged: Spans = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def excluded_spans(texts: Sequence[str], layouts: Sequence[str | None] | None = None) -> list[Spans]:
    """Per text, the characters that belong to no text: the template's (chat texts) and the data
    set's boilerplate.  ``layouts``: each text's stored ``ChatLayout`` JSON, or None for a plain text."""
    from gnq_core.sources.chat import ChatLayout

    given = layouts if layouts is not None else [None] * len(texts)
    parsed = [ChatLayout.from_json(x) if isinstance(x, str) and x else None for x in given]
    pieces = [[(t.kind, t.start, t.end) for t in lay.turns] if lay is not None else [] for lay in parsed]
    shared = boilerplate_spans(texts, pieces if any(parsed) else None)
    return [_merged(list(lay.template) + spans if lay is not None else spans)
            for lay, spans in zip(parsed, shared, strict=True)]


def own_contents(texts: Sequence[str], layouts: Sequence[str | None] | None = None) -> list[str]:
    """Each text without what belongs to no text (its pieces joined by a newline): what copy
    detection compares."""
    out = []
    for text, spans in zip(texts, excluded_spans(texts, layouts), strict=True):
        kept, at = [], 0
        for s, e in spans:
            kept.append(text[at:s])
            at = e
        kept.append(text[at:])
        out.append("\n".join(k for k in kept if k.strip()))
    return out
