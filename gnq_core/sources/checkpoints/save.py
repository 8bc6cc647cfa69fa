"""Saving a checkpoint (model in safetensors and tokenizer) atomically: a folder is published
complete or not at all."""

from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gnq_core.common.atomic import check_folder_target


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> None:
    """Save model (safetensors) and tokenizer to `path`, atomically.

    Everything is written to the sibling folder "<path>.tmp-<pid>", which is renamed to `path`
    only once complete; an existing `path` is moved aside (to "<path>.old-<pid>") and removed
    only after that. find_checkpoints skips both kinds of sibling, so an interrupted save never
    yields a half-written checkpoint.
    """
    target = Path(path)
    if target.name in ("", ".", ".."):
        raise ValueError(f"{path}: not a usable checkpoint folder name")
    check_folder_target(target, "a checkpoint folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    old = target.with_name(f"{target.name}.old-{os.getpid()}")
    # an earlier save killed outright (kill -9) leaves its "<name>.tmp-<pid>": incomplete by definition
    for stale in (*target.parent.glob(f"{glob.escape(target.name)}.tmp-*"), old):
        _remove(stale)
    try:
        tmp.mkdir()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _fsync_tree(tmp)
        if target.exists() or target.is_symlink():
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException as exc:
        _remove(tmp)
        if old.exists() and not target.exists():
            os.replace(old, target)  # put the previous checkpoint back
        if not isinstance(exc, OSError) and (code := _os_error_code(exc)) is not None:
            # safetensors reports a full disk as SafetensorError("... (os error 28)"): make it the
            # OSError it is, so the CLI says "<checkpoint>: No space left on device" in one line
            raise OSError(code, os.strerror(code), str(target)) from exc
        raise
    _remove(old)


def _os_error_code(exc: BaseException) -> int | None:
    match = re.search(r"\(os error (\d+)\)", str(exc))
    return int(match.group(1)) if match else None


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _fsync_tree(folder: Path) -> None:
    """Flush the written files to disk, so the rename never publishes a folder with empty files."""
    for file in folder.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
