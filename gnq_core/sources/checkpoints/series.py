"""A series of checkpoints: the ones a folder holds, found in training order, and one tokenizer and
one architecture per series.  An audit compares each text's GNQ across the checkpoints of a series,
and tokenises the texts once; a checkpoint with another vocabulary or another architecture (a folder
dropped in by mistake, a swapped model) would be audited silently against token ids and shapes that
mean something else: refused in one line naming both folders."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from gnq_core.errors import GNQError
from gnq_core.sources.checkpoints.errors import CheckpointError, folder_error, reason
from gnq_core.sources.checkpoints.files import (
    ADAPTER_CONFIG,
    CONFIG_NAME,
    IN_PROGRESS,
    CheckpointRef,
    checkpoint_hash,
    weight_files,
)
from gnq_core.sources.checkpoints.tokenizer import load_tokenizer
from gnq_core.sources.limits import BOUNDS

_TRAILING_NUMBER = re.compile(r"(\d+)$")


def trailing_number(name: str) -> int | None:
    """The number a folder's name ends with (epoch-3 -> 3), or None."""
    m = _TRAILING_NUMBER.search(name)
    return int(m.group(1)) if m else None


def find_checkpoints(directory: str | Path) -> list[CheckpointRef]:
    """The checkpoints in `directory`, in training order.

    The immediate subfolders that contain a config.json are returned, ordered by the number their
    name ends with (natural sort: epoch-2 before epoch-10), the unnumbered ones after them in name
    order. Hidden folders and the temporary folders of an unfinished `save_checkpoint` are skipped.
    A folder with a config.json and no such subfolders is itself the one checkpoint.  A Hugging
    Face Trainer's output folder has both: checkpoint-*/ and the final model at its top (often
    also in final/); a top-level or unnumbered model with the same weights as the last numbered
    checkpoint is that checkpoint again and is not listed twice, a different one comes last.
    """
    directory = Path(directory)
    if not directory.exists():
        raise folder_error(directory, "no such directory")
    if not directory.is_dir():
        raise folder_error(directory, "not a directory")
    root = directory.resolve()
    itself = CheckpointRef(label=root.name, path=root, order=trailing_number(root.name) or 0)
    top_level = (root / CONFIG_NAME).is_file()
    numbered: list[tuple[int, str, Path]] = []
    unnumbered: list[tuple[str, Path]] = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise folder_error(directory, f"cannot list the directory ({reason(exc)})") from exc
    for sub in entries:
        name = sub.name
        if name.startswith(".") or IN_PROGRESS.search(name):
            continue
        if not (sub.is_dir() and (sub / CONFIG_NAME).is_file()):
            continue
        if top_level and not _has_weights(sub):  # beside a model: only folders that hold one too
            continue
        number = trailing_number(name)
        if number is None:
            unnumbered.append((name, sub.resolve()))
        else:
            numbered.append((number, name, sub.resolve()))
    if not numbered and not unnumbered:
        if top_level:
            return [itself]
        if (root / ADAPTER_CONFIG).is_file() or any((sub / ADAPTER_CONFIG).is_file() for sub in entries):
            raise folder_error(directory, f"holds PEFT adapter checkpoints ({ADAPTER_CONFIG}), not full "
                                          "models: give the base model they were trained from with "
                                          "--base-model PATH")
        raise folder_error(directory, "no checkpoint folders (no config.json here or in any subfolder)")

    numbered.sort(key=lambda t: (t[0], t[1]))
    refs = [CheckpointRef(label=name, path=path, order=number) for number, name, path in numbered]
    last = numbered[-1][2] if numbered else None
    extra = [(name, path) for name, path in unnumbered if last is None or not _same_model(path, last)]
    listed = [r.path for r in refs[-1:]] + [path for _, path in extra]
    if top_level and not any(_same_model(root, path) for path in listed):
        extra.append((root.name, root))
    start = numbered[-1][0] + 1 if numbered else 0
    refs += [CheckpointRef(label=name, path=path, order=start + i) for i, (name, path) in enumerate(extra)]
    return refs


def _has_weights(folder: Path) -> bool:
    try:
        return bool(weight_files(folder)[1])
    except (CheckpointError, OSError):
        return False


def _same_model(a: Path, b: Path) -> bool:
    """Whether two checkpoint folders hold the same weights and config (sizes first: only folders
    that could be copies are read in full)."""
    try:
        files_a, files_b = weight_files(a)[1], weight_files(b)[1]
        sizes = [sorted((f.name, f.stat().st_size) for f in files) for files in (files_a, files_b)]
        return sizes[0] == sizes[1] and checkpoint_hash(a) == checkpoint_hash(b)
    except (CheckpointError, OSError):
        return False


_ARCHITECTURE_KEYS = frozenset({"model_type", "architectures"}).union(*(b.keys for b in BOUNDS))


class SeriesError(GNQError, ValueError):
    """Checkpoints of one series that do not share a tokenizer or an architecture."""


def _architecture(folder: Path) -> dict[str, Any]:
    raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return {k: raw[k] for k in sorted(_ARCHITECTURE_KEYS) if k in raw}


def _vocabulary(folder: Path) -> str:
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
