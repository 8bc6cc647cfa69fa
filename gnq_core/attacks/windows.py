"""Where each text's extraction window is: inside one message's own content, never in what the
chat template wrote or in boilerplate most texts share (sources/boilerplate.py).

A window is a target of ``s`` tokens that starts and ends in one piece of a text's own content
(a maximal run of tokens inside one message's content, outside every excluded span); its prompt is
everything before it, as at training: for a conversation, the turns up to there rendered with the
template (the assistant header included).  The window starts ``p`` tokens into its piece when the
piece is long enough, else as late as leaves ``s`` tokens.  A conversation's first trained piece
that holds a window is taken (an untrained one when no trained piece does).  A plain text without
boilerplate keeps the rule it always had: the target is ``tokens[p:p+s]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gnq_core.sources.boilerplate import excluded_spans
from gnq_core.sources.chat import ChatLayout

__all__ = ["SharedPassage", "Window", "content_windows", "shared_passages"]


@dataclass(frozen=True)
class Window:
    start: int  # the target's first token (the prompt is every token before it)
    turn: str | None  # system / user / assistant; None for a plain text
    trained: bool | None  # whether that turn carried the loss; None for a plain text


def content_windows(tokenizer, texts: Sequence[str], layouts: Sequence[str | None] | None,
                    ids: Sequence[Sequence[int]], prefix_tokens: int, suffix_tokens: int
                    ) -> list[Window | None] | None:
    """Each text's window (None: it has no piece long enough); None for the whole list when no text
    has a layout or an excluded span (the plain rule, ``tokens[p:p+s]``, then applies as before)."""
    excluded = excluded_spans(texts, layouts)
    parsed = [ChatLayout.from_json(x) if isinstance(x, str) and x else None
              for x in (layouts if layouts is not None else [None] * len(texts))]
    if not any(parsed) and not any(excluded):
        return None
    windows: list[Window | None] = []
    for text, lay, spans, tokens in zip(texts, parsed, excluded, ids, strict=True):
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        offsets = offsets[: len(tokens)]
        turns = [(t.start, t.end, t.kind, t.trained) for t in lay.turns if t.start >= 0] if lay is not None \
            else [(0, len(text), None, None)]
        pieces: list[tuple[int, int, str | None, bool | None]] = []
        for start, end, kind, trained in turns:
            run: list[int] = []
            for k, (a, b) in enumerate(offsets):
                inside = start <= a and b <= end and a < b and not any(a < e and b > s for s, e in spans)
                if inside:
                    run.append(k)
                if run and (not inside or k == len(offsets) - 1):
                    pieces.append((run[0], run[-1] + 1, kind, trained))
                    run = []
        need_prompt = prefix_tokens if lay is None else 1
        ordered = sorted(pieces, key=lambda p: (p[3] is False, p[0]))  # trained pieces first, in order
        chosen = None
        for first, last, kind, trained in ordered:
            start = first + min(prefix_tokens, last - first - suffix_tokens)
            if last - first >= suffix_tokens and start >= need_prompt:
                chosen = Window(start, kind, trained)
                break
        windows.append(chosen)
    return windows


@dataclass(frozen=True)
class SharedPassage:
    """A passage most texts hold verbatim (the template's or the data set's), probed once."""

    text: str
    texts: int  # how many texts hold it
    example_id: int  # the text it was probed in
    start: int  # its first token in that text


def shared_passages(tokenizer, texts: Sequence[str], layouts: Sequence[str | None] | None,
                    ids: Sequence[Sequence[int]], example_ids: Sequence[int], share: float = 0.5,
                    limit: int = 5) -> list[SharedPassage]:
    """The excluded passages (template and boilerplate) at least ``share`` of the texts hold, most
    common first (at most ``limit``), each located in the first text holding it."""
    excluded = excluded_spans(texts, layouts)
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, int]] = {}
    for i, (text, spans) in enumerate(zip(texts, excluded, strict=True)):
        for s, e in spans:
            passage = text[s:e]
            if passage.strip():
                counts[passage] = counts.get(passage, 0) + 1
                first.setdefault(passage, (i, s))
    common = sorted((p for p, n in counts.items() if n >= max(2, share * len(texts))),
                    key=lambda p: (-counts[p], -len(p)))[:limit]
    out = []
    for passage in common:
        i, char = first[passage]
        offsets = tokenizer(texts[i], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        start = next((k for k, (a, _) in enumerate(offsets[: len(ids[i])]) if a >= char), None)
        if start is not None:
            out.append(SharedPassage(passage, counts[passage], int(example_ids[i]), start))
    return out
