"""Finding, hashing, loading and saving Hugging Face causal-LM checkpoints: this module finds and
checks them; ``checkpoint_io`` loads and saves, ``checkpoint_files`` reads a folder's files and
config, ``checkpoint_checks`` holds the checks both share.  The public names are all here.

Checkpoint folders are UNTRUSTED input: nothing here runs code from them. Remote code is never
trusted, nothing is fetched from the hub, safetensors weights are preferred and pickled weights
(`*.bin`, `*.pt`) are only read by `torch.load(weights_only=True)`, which refuses arbitrary
objects. Every problem surfaces as a `CheckpointError` with a one-line message that names the
file or folder.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.utils import logging as hf_logging

from gnq_core.sources import limits
from gnq_core.sources.checkpoint_checks import (  # noqa: F401 (TOKENIZER_HINT: re-exported)
    TOKENIZER_HINT,
    _allowed_missing,
    _as_checkpoint_error,
    _check_memory,
    _check_vocab,
    _load_tokenizer,
    _shape_mismatches,
)
from gnq_core.sources.checkpoint_files import (  # noqa: F401 (re-exported: the names' old path)
    _IN_PROGRESS,
    ADAPTER_CONFIG,
    CONFIG_NAME,
    PICKLE_INDEX,
    PICKLE_WEIGHTS,
    SAFE_INDEX,
    SAFE_WEIGHTS,
    TOKENIZER_FILES,
    CheckpointError,
    CheckpointRef,
    _check_safetensors,
    _checkpoint_dir,
    _error,
    _load_config,
    _load_pickled_weights,
    _reason,
    _weight_files,
    checkpoint_hash,
)
from gnq_core.sources.checkpoint_io import load_checkpoint, load_tokenizer, save_checkpoint
from gnq_core.sources.weight_checks import integer_weight, nonfinite_tensor

__all__ = [
    "TOKENIZER_FILES",
    "CheckpointError",
    "CheckpointRef",
    "check_checkpoint",
    "checkpoint_hash",
    "find_checkpoints",
    "load_checkpoint",
    "load_tokenizer",
    "max_positions",
    "parameter_count",
    "save_checkpoint",
]


_TRAILING_NUMBER = re.compile(r"(\d+)$")


def _trailing_number(name: str) -> int | None:
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
        raise _error(directory, "no such directory")
    if not directory.is_dir():
        raise _error(directory, "not a directory")
    root = directory.resolve()
    itself = CheckpointRef(label=root.name, path=root, order=_trailing_number(root.name) or 0)
    top_level = (root / CONFIG_NAME).is_file()
    numbered: list[tuple[int, str, Path]] = []
    unnumbered: list[tuple[str, Path]] = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise _error(directory, f"cannot list the directory ({_reason(exc)})") from exc
    for sub in entries:
        name = sub.name
        if name.startswith(".") or _IN_PROGRESS.search(name):
            continue
        if not (sub.is_dir() and (sub / CONFIG_NAME).is_file()):
            continue
        if top_level and not _has_weights(sub):  # beside a model: only folders that hold one too
            continue
        number = _trailing_number(name)
        if number is None:
            unnumbered.append((name, sub.resolve()))
        else:
            numbered.append((number, name, sub.resolve()))
    if not numbered and not unnumbered:
        if top_level:
            return [itself]
        if (root / ADAPTER_CONFIG).is_file() or any((sub / ADAPTER_CONFIG).is_file() for sub in entries):
            raise _error(directory, f"holds PEFT adapter checkpoints ({ADAPTER_CONFIG}), not full models: "
                                    "give the base model they were trained from with --base-model PATH")
        raise _error(directory, "no checkpoint folders (no config.json here or in any subfolder)")

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


def max_positions(path: str | Path) -> int | None:
    """The most tokens the checkpoint's model can read (max_position_embeddings in its config.json),
    or None when the config does not say (or cannot be read: check_checkpoint reports that)."""
    try:
        config = _load_config(_checkpoint_dir(path))
    except (CheckpointError, OSError):
        return None
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None



def parameter_count(path: str | Path) -> int | None:
    """The model's number of parameters without loading it: the elements its safetensors headers
    list, else its pickled weight files' bytes over 4 (float32); None when the folder has no
    readable weights (check_checkpoint reports why)."""
    try:
        kind, files = _weight_files(_checkpoint_dir(path))
        if kind == "safetensors":
            return limits.weights_elements(files)
        return sum(f.stat().st_size for f in files) // 4
    except (CheckpointError, OSError, ValueError, struct.error):
        return None

def _has_weights(folder: Path) -> bool:
    try:
        return bool(_weight_files(folder)[1])
    except (CheckpointError, OSError):
        return False


def _same_model(a: Path, b: Path) -> bool:
    """Whether two checkpoint folders hold the same weights and config (sizes first: only folders
    that could be copies are read in full)."""
    try:
        files_a, files_b = _weight_files(a)[1], _weight_files(b)[1]
        sizes = [sorted((f.name, f.stat().st_size) for f in files) for files in (files_a, files_b)]
        return sizes[0] == sizes[1] and checkpoint_hash(a) == checkpoint_hash(b)
    except (CheckpointError, OSError):
        return False


def check_checkpoint(path: str | Path, max_length: int | None = None,
                     dtype: torch.dtype | None = None, tokenizer: str | Path | None = None) -> None:
    """What load_checkpoint checks, short of reading the weights: config.json (a causal LM with at
    least ``max_length`` positions), the weight files (safetensors headers: names and shapes against
    the config), the tokenizer and its size.  Cheap enough to run on every checkpoint of a series
    before an audit writes anything.  Also the sanity bounds of gnq_core.sources.limits: sizes in
    config.json, tokenizer file size and ids, and the weights' memory (in ``dtype``, if given)
    against the memory available."""
    folder = _checkpoint_dir(path)
    with _as_checkpoint_error(folder):
        config = _load_config(folder)
        positions = getattr(config.get_text_config(), "max_position_embeddings", None)
        if max_length is not None and isinstance(positions, int) and max_length > positions:
            raise _error(folder, f"--max-length {max_length} is more than the {positions} positions the "
                                 f"model has (max_position_embeddings in {CONFIG_NAME}); use --max-length "
                                 f"{positions} or less")
        kind, files = _weight_files(folder)
        _check_memory(folder, kind, files, dtype)  # before safetensors maps the file
        if kind == "safetensors":
            for file in files:
                _check_safetensors(file)
        else:
            _load_pickled_weights(files)  # weights-only, memory-mapped: refuses anything but tensors
        _check_vocab(folder, config, _load_tokenizer(folder, config, tokenizer))
        if kind == "safetensors" and (problem := _header_problem(folder, config, files)):
            raise _error(folder, problem)
        if kind == "safetensors" and (where := nonfinite_tensor(files)) is not None:
            raise _error(folder, f"{where} holds NaN or infinite values: every batch would be non-finite")


def _header_problem(folder: Path, config: Any, files: list[Path]) -> str:
    """Weights transformers would not load cleanly, per the safetensors headers ("" if none).

    Asks transformers itself: ``from_pretrained`` on the meta device with empty meta tensors
    named and shaped as in the files, so its own key renames (GPT-NeoX's ``embed_out``), weight
    conversions (Mixtral's per-expert layout) and tied weights apply, and nothing is allocated.
    A weight it would have to initialise (missing) or cannot convert is a problem; weights it
    does not use are left to the load (a warning)."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    state = _meta_state(files)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its loading report is ours to word, in one line
    try:
        model, info = model_class.from_pretrained(None, config=config, state_dict=state, device_map="meta",
                                                  output_loading_info=True, ignore_mismatched_sizes=False)
    except Exception as exc:
        text = str(exc).lower()
        if "ignore_mismatched_sizes" in text or "size mismatch" in text:
            detail = _shape_mismatches(model_class, config, "safetensors", files, None)
            return f"weights do not match {CONFIG_NAME} (shape mismatch{detail})"
        return f"weights do not match {CONFIG_NAME} ({type(exc).__name__}: {_reason(exc)})"
    finally:
        hf_logging.set_verbosity(verbosity)
    if info.get("mismatched_keys"):
        keys = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info["mismatched_keys"])
        return f"weights do not match {CONFIG_NAME} (shape mismatch: {', '.join(keys[:3])})"
    missing = sorted(set(map(str, info.get("missing_keys") or ())) - _allowed_missing(model, config))
    if missing:
        more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
        return f"weights do not match {CONFIG_NAME}: missing {', '.join(missing[:3])}{more}"
    if (stored := integer_weight(state, [name for name, _ in model.named_parameters()])) is not None:
        return f"weights do not match {CONFIG_NAME}: {stored}"
    return ""


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def _meta_state(files: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files as an empty meta tensor of its shape and dtype."""
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118  (safe_open objects are not iterable)
                piece = f.get_slice(key)
                dtype = _SAFETENSORS_DTYPES.get(piece.get_dtype(), torch.float32)
                state[key] = torch.empty(piece.get_shape(), dtype=dtype, device="meta")
    return state
