"""One tokenizer and one architecture per series: an audit compares each text's GNQ across the
checkpoints of a series, and tokenises the texts once; a checkpoint with another vocabulary or
another architecture (a folder dropped in by mistake, a swapped model) would be audited silently
against token ids and shapes that mean something else.  Refused in one line naming both folders."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from gnq_core.errors import GNQError
from gnq_core.sources.limits import BOUNDS

_ARCHITECTURE_KEYS = frozenset({"model_type", "architectures"}).union(*(b.keys for b in BOUNDS))


class SeriesError(GNQError, ValueError):
    """Checkpoints of one series that do not share a tokenizer or an architecture."""


def _architecture(folder: Path) -> dict[str, Any]:
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return {k: raw[k] for k in sorted(_ARCHITECTURE_KEYS) if k in raw}


def _vocabulary(folder: Path) -> str:
    from gnq_core.sources.checkpoints import load_tokenizer

    vocab = load_tokenizer(folder).get_vocab()
    return hashlib.sha256(json.dumps(sorted(vocab.items())).encode()).hexdigest()


def check_one_series(folders: list[Path], tokenizer: str | Path | None = None) -> None:
    """Every folder has the first one's vocabulary (token -> id) and architecture (model type and
    sizes in config.json); checked after each was checked on its own.  ``tokenizer``: the folder
    every checkpoint reads its tokenizer from (checkpoints saved without one): one vocabulary."""
    if len(folders) < 2:
        return
    first = folders[0]
    arch, vocab = _architecture(first), (None if tokenizer is not None else _vocabulary(first))
    for folder in folders[1:]:
        other = _architecture(folder)
        if other != arch:
            differ = sorted(k for k in arch.keys() | other.keys() if arch.get(k) != other.get(k))
            raise SeriesError(f"{folder}: another architecture than {first.name} ({', '.join(differ)} "
                              "differ); a series is one model's checkpoints: audit it separately")
        if vocab is not None and _vocabulary(folder) != vocab:
            raise SeriesError(f"{folder}: another tokenizer than {first.name} (the vocabularies differ); "
                              "a series shares one tokenizer: audit it separately")
