"""Loading a checkpoint (its model and tokenizer, checked on the way) and saving one atomically."""

from __future__ import annotations

import glob
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from gnq_core.atomic import check_folder_target
from gnq_core.sources import limits
from gnq_core.sources.checkpoint_checks import (
    _allowed_missing,
    _as_checkpoint_error,
    _check_memory,
    _check_vocab,
    _load_tokenizer,
    _shape_mismatches,
)
from gnq_core.sources.checkpoint_files import (
    CONFIG_NAME,
    CheckpointError,
    _check_safetensors,
    _checkpoint_dir,
    _error,
    _load_config,
    _load_pickled_weights,
    _reason,
    _weight_files,
)


def load_tokenizer(path: str | Path, tokenizer: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer alone (no weights read), as load_checkpoint returns it."""
    folder = _checkpoint_dir(path)
    with _as_checkpoint_error(folder):
        return _load_tokenizer(folder, _load_config(folder), tokenizer)


def load_checkpoint(path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                    allow_pickle_weights: bool = True, tokenizer: str | Path | None = None,
                    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local checkpoint folder, safely.

    Never runs remote code and never touches the network. Weights come from model.safetensors
    (or its sharded form with model.safetensors.index.json); a folder with only pickled weights
    (pytorch_model.bin, its shards, or one other *.bin / *.pt) is read with
    torch.load(weights_only=True), or refused when `allow_pickle_weights` is False. Every weight
    the config's model has must be present with its shape (the tied lm_head excepted). The model
    is returned in eval mode on `device`, in `dtype` when given (else the dtype it was saved in);
    a tokenizer without a pad token gets pad = eos; ``tokenizer``: a folder to read it from
    instead (checkpoints saved without one). Any problem raises CheckpointError.
    """
    folder = _checkpoint_dir(path)
    with _as_checkpoint_error(folder):
        return _load(folder, device=device, dtype=dtype, allow_pickle_weights=allow_pickle_weights,
                     tokenizer=tokenizer)


def _load(folder: Path, *, device: torch.device | str, dtype: torch.dtype | None,
          allow_pickle_weights: bool, tokenizer: str | Path | None = None,
          ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    config = _load_config(folder)
    kind, files = _weight_files(folder)
    if kind == "pickle" and not allow_pickle_weights:
        names = ", ".join(f.name for f in files)
        raise _error(folder, f"only pickled weights ({names}) and allow_pickle_weights=False; "
                             "convert them to safetensors")

    tokenizer = _load_tokenizer(folder, config, tokenizer)
    _check_vocab(folder, config, tokenizer)

    model_class: type[PreTrainedModel] = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    common: dict[str, Any] = {
        "config": config,
        "dtype": dtype if dtype is not None else "auto",
        "ignore_mismatched_sizes": False,
        "output_loading_info": True,
        "trust_remote_code": False,
        "local_files_only": True,
    }
    state: dict[str, torch.Tensor] | None = None
    try:
        _check_memory(folder, kind, files, dtype)
        if kind == "safetensors":
            for file in files:
                _check_safetensors(file)
            model, info = model_class.from_pretrained(folder, use_safetensors=True, **common)
        else:
            state = _load_pickled_weights(files)
            model, info = model_class.from_pretrained(None, state_dict=state, **common)
    except (CheckpointError, limits.LimitError):
        raise
    except Exception as exc:
        text = str(exc).lower()
        if "ignore_mismatched_sizes" in text or "size mismatch" in text:
            detail = _shape_mismatches(model_class, config, kind, files, state)
            raise _error(folder, f"weights do not match {CONFIG_NAME} (shape mismatch{detail})") from exc
        where = files[0] if len(files) == 1 else folder
        raise _error(where, f"cannot load the weights ({type(exc).__name__}: {_reason(exc)})") from exc

    if info.get("mismatched_keys"):
        keys = sorted(map(str, info["mismatched_keys"]))
        raise _error(folder, f"weights do not match {CONFIG_NAME} (shape mismatch: {', '.join(keys[:3])})")
    missing = set(map(str, info.get("missing_keys") or ())) - _allowed_missing(model, config)
    if missing:
        keys = sorted(missing)
        more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
        raise _error(folder, f"weights do not match {CONFIG_NAME}: missing {', '.join(keys[:3])}{more}")
    unexpected = sorted(map(str, info.get("unexpected_keys") or ()))
    if unexpected:
        warnings.warn(f"{folder}: {len(unexpected)} weights not used by the model (e.g. {unexpected[0]})",
                      stacklevel=3)

    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise _error(folder, f"the tokenizer has {len(tokenizer)} tokens but the model has {rows} "
                             "embedding rows")
    limits.check_token_ids(folder, tokenizer.get_vocab(), rows, "the model's number of embedding rows")

    model = model.to(device=device) if dtype is None else model.to(device=device, dtype=dtype)
    model.eval()
    return model, tokenizer


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
