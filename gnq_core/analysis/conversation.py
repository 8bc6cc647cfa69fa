"""A conversation read as one: its turns (role: content) from the stored layout
(sources/chat.py ``ChatLayout``), with leaked characters marked inside their turn; the raw
rendered text (template tokens and all) stays available as "as tokenised"."""

from __future__ import annotations

import html
from collections.abc import Sequence

from gnq_core.sources.chat import ChatLayout

__all__ = ["conversation_html", "conversation_text", "leaked_span", "turns"]


def turns(text: str, layout: str | None) -> list[tuple[str, str, bool, int, int]] | None:
    """(role, content, trained, start, end) of each turn found in ``text``; None: a plain text."""
    if not isinstance(layout, str) or not layout:
        return None
    parsed = ChatLayout.from_json(layout)
    return [(t.kind, text[t.start:t.end], t.trained, t.start, t.end) for t in parsed.turns if t.start >= 0]


def conversation_text(text: str, layout: str | None) -> str:
    """``role: content`` lines, one per turn (the text itself when it is no conversation)."""
    if not isinstance(layout, str) or not layout:
        return text
    return ChatLayout.from_json(layout).conversation(text)


def leaked_span(text: str, leaked: str | None) -> tuple[int, int] | None:
    """Where the characters the model gave back (an extraction's target) are in ``text``."""
    if not leaked or not leaked.strip():
        return None
    at = text.find(leaked)
    return (at, at + len(leaked)) if at >= 0 else None


def conversation_html(text: str, layout: str | None, marks: Sequence[tuple[int, int]] = ()) -> str:
    """The turns as HTML (role in bold, untrained turns greyed), ``marks`` (character spans of the
    rendered text) highlighted where they fall inside a turn; the raw text behind an "as
    tokenised" toggle.  A plain text: itself, escaped, with its marks."""
    e = html.escape
    found = turns(text, layout)

    def marked(start: int, end: int) -> str:
        out, at = [], start
        for s, t in sorted(marks):
            s, t = max(s, start), min(t, end)
            if s >= t or s < at:
                continue
            out += [e(text[at:s]), f"<mark>{e(text[s:t])}</mark>"]
            at = t
        out.append(e(text[at:end]))
        return "".join(out)

    if found is None:
        return marked(0, len(text))
    lines = [f"<div class='turn{'' if trained else ' untrained'}'><b>{e(role)}:</b> {marked(s, t)}</div>"
             for role, _, trained, s, t in found]
    return ("".join(lines) + f"<details><summary>as tokenised</summary><pre>{e(text)}</pre></details>")
