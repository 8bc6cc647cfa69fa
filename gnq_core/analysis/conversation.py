"""A conversation read as one: its turns (role: content) from the stored layout
(sources/chat.py ``ChatLayout``), with leaked characters marked inside their turn; the raw
rendered text (template tokens and all) stays available as "as tokenised"."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import pandas as pd

from gnq_core.sources.chat import ChatLayout

__all__ = ["TURN_STYLE", "conversation_html", "conversation_line", "conversation_text", "conversation_upto",
           "is_chat",
           "leaked_marks", "leaked_span", "marked_html", "turn_html", "turns", "turns_html"]

# A turn on a page: its role and whether it was trained above the content; untrained turns greyed
TURN_STYLE = """
.gnq-turn{border-left:3px solid #2563eb;padding:.25em .6em;margin:.35em 0}
.gnq-turn.untrained{border-left-color:#bbb;color:#666}
.gnq-turn .head{font-size:.8em;color:#555}.gnq-turn .body{white-space:pre-wrap;overflow-wrap:anywhere}
.gnq-turn mark{background:#fecaca}
"""


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


def is_chat(frame: pd.DataFrame) -> bool:
    """Whether a frame of texts (the store's totals, or a slice of them) holds conversations."""
    return "turns" in frame.columns and bool(frame["turns"].notna().any())


def conversation_line(text: str, layout: str | None, n: int | None = None) -> str:
    """``role: content`` of each turn on one line, " │ " between turns (a table cell or a picker's
    label), shortened to ``n`` characters; a plain text: itself, its whitespace collapsed."""
    found = turns(text, layout)
    lines = [text] if found is None else [f"{role}: {content}" for role, content, *_ in found]
    said = " │ ".join(" ".join(line.split()) for line in lines)
    return said if n is None or len(said) <= n else said[: n - 1] + "…"


def conversation_upto(text: str, layout: str | None, prefix: str) -> str:
    """What an attack prompted with, read as turns: ``prefix`` (a start of the rendered ``text``)
    as ``role: content`` lines, the last turn cut where the prefix ends; ``prefix`` itself for a
    plain text or one it does not start."""
    found = turns(text, layout)
    if found is None or not text.startswith(prefix):
        return prefix
    end = len(prefix)
    return "\n".join(f"{role}: {text[s:min(t, end)]}" for role, _, _, s, t in found if s < end)


def leaked_span(text: str, leaked: str | None) -> tuple[int, int] | None:
    """Where the characters the model gave back (an extraction's target) are in ``text``."""
    if not leaked or not leaked.strip():
        return None
    at = text.find(leaked)
    return (at, at + len(leaked)) if at >= 0 else None


def leaked_marks(text: str, row: Mapping, secrets: pd.DataFrame | None = None) -> list[tuple[int, int]]:
    """The characters of ``text`` that came out: the text attack's window when it was extracted
    (``row``: the verdict's row), and each secret value the model wrote whole (``secrets``: the
    store's secret attack rows of this text)."""
    def yes(value) -> bool:  # True, numpy's True; not NA (no attack) nor False
        return value is not None and not pd.isna(value) and bool(value)

    marks = []
    if yes(row.get("extracted")) and (span := leaked_span(text, row.get("extraction_target"))):
        marks.append(span)
    if secrets is not None and len(secrets):
        marks += [(int(r.secret_start), int(r.secret_end)) for r in secrets.itertuples()
                  if yes(r.extracted) and 0 <= r.secret_start < r.secret_end <= len(text)]
    return marks


def marked_html(text: str, start: int, end: int, marks: Sequence[tuple[int, int]] = ()) -> str:
    """``text[start:end]`` escaped, the parts of ``marks`` (character spans of ``text``) inside it
    in <mark>; overlapping marks: the first one wins."""
    e = html.escape
    out, at = [], start
    for s, t in sorted(marks):
        s, t = max(s, start), min(t, end)
        if s >= t or s < at:
            continue
        out += [e(text[at:s]), f"<mark>{e(text[s:t])}</mark>"]
        at = t
    out.append(e(text[at:end]))
    return "".join(out)


def turn_html(text: str, role: str, trained: bool, start: int, end: int,
              marks: Sequence[tuple[int, int]] = ()) -> str:
    """One turn on its own (style: ``TURN_STYLE``): its role, whether the fine-tune trained on it,
    and its content with the leaked characters marked."""
    said = "trained" if trained else "not trained (no loss on it)"
    return (f"<div class='gnq-turn{'' if trained else ' untrained'}'><div class='head'><b>{html.escape(role)}"
            f"</b> · {said}</div><div class='body'>{marked_html(text, start, end, marks)}</div></div>")


def turns_html(text: str, layout: str, marks: Sequence[tuple[int, int]] = ()) -> str:
    """Every turn of a conversation on its own (``turn_html``), with its style: a page's view of it."""
    found = turns(text, layout) or []
    return f"<style>{TURN_STYLE}</style>" + "".join(
        turn_html(text, role, trained, start, end, marks) for role, _, trained, start, end in found)


def conversation_html(text: str, layout: str | None, marks: Sequence[tuple[int, int]] = ()) -> str:
    """The turns as HTML (role in bold, untrained turns greyed), ``marks`` (character spans of the
    rendered text) highlighted where they fall inside a turn; the raw text behind an "as
    tokenised" toggle.  A plain text: itself, escaped, with its marks."""
    e = html.escape
    found = turns(text, layout)
    if found is None:
        return marked_html(text, 0, len(text), marks)
    lines = [f"<div class='turn{'' if trained else ' untrained'}'><b>{e(role)}:</b> "
             f"{marked_html(text, s, t, marks)}</div>" for role, _, trained, s, t in found]
    return ("".join(lines) + f"<details><summary>as tokenised</summary><pre>{e(text)}</pre></details>")
