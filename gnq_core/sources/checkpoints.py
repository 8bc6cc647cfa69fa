"""Finding, hashing, loading and saving Hugging Face causal-LM checkpoints.

Checkpoint folders are UNTRUSTED input: nothing here runs code from them. Remote code is never
trusted, nothing is fetched from the hub, safetensors weights are preferred and pickled weights
(`*.bin`, `*.pt`) are only read by `torch.load(weights_only=True)`, which refuses arbitrary
objects. Every problem surfaces as a `CheckpointError` with a one-line message that names the
file or folder.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import pickle
import re
import shutil
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)
from transformers.utils import logging as hf_logging

from gnq_core.errors import GNQError
from gnq_core.sources import limits
from gnq_core.sources.links import LinkError, check_folder_links
from gnq_core.sources.tokenizer_panics import TokenizerFailure, panics_as_one_line
from gnq_core.sources.weight_checks import integer_weight, nonfinite_config_field, nonfinite_tensor

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
    "save_checkpoint",
]

CONFIG_NAME = "config.json"
SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
PICKLE_WEIGHTS = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
# Files whose presence means the folder has a tokenizer AutoTokenizer can read locally.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")
# Pickles a training run leaves beside the weights (optimizer state, trainer arguments, RNG states).
_NOT_WEIGHTS = re.compile(r"^(training_args|optimizer|scheduler|scaler|rng_state|random_states)")
_SHARD = re.compile(r"-\d+-of-\d+\.[^.]+$")
_TRAILING_NUMBER = re.compile(r"(\d+)$")
# Folders save_checkpoint writes before they are complete (or while replacing an old checkpoint).
_IN_PROGRESS = re.compile(r"\.(tmp|old)-\d+$")
_MAX_CONFIG_BYTES = 16 * 2**20
_CHUNK = 2**20

# Model types whose causal-LM class is an encoder run as a decoder: only causal with is_decoder=True.
_ENCODER_TYPES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) & frozenset(MODEL_FOR_MASKED_LM_MAPPING_NAMES)

# Our own progress bars say what is happening; transformers' per-load bars would only add noise.
hf_logging.disable_progress_bar()


def _class_names(value: str | tuple[str, ...] | list[str]) -> set[str]:
    return {value} if isinstance(value, str) else set(value)


_CAUSAL_LM_CLASSES = frozenset(n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values() for n in _class_names(v))


class CheckpointError(GNQError, ValueError):
    """A checkpoint that cannot be found or loaded safely; the message is one line naming the file/folder."""


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint folder of a series.

    label: the folder name ("epoch-3"). path: the resolved folder. order: the number the name ends
    with (epoch-3 -> 3, checkpoint-500 -> 500); for a folder without one, after every numbered one,
    in name order (the first unnumbered folder of a series gets max number + 1, the next + 2, ...;
    in a series with no numbered folder that is the position in name order, from 0).
    """

    label: str
    path: Path
    order: int


def _one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of `text`, shortened to `limit` characters."""
    for line in str(text).splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _reason(exc: BaseException) -> str:
    return _one_line(str(exc)) or type(exc).__name__


def _error(where: str | Path, problem: str) -> CheckpointError:
    return CheckpointError(_one_line(f"{where}: {problem}", limit=600))


# --------------------------------------------------------------------------------------------- finding


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


# --------------------------------------------------------------------------------------------- weights


def _checkpoint_dir(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.exists():
        raise _error(folder, "no such checkpoint folder")
    if not folder.is_dir():
        raise _error(folder, "not a checkpoint folder (not a directory)")
    try:
        check_folder_links(folder)
    except LinkError as exc:
        raise CheckpointError(str(exc)) from exc
    return folder


def _shards_from_index(folder: Path, index_name: str) -> list[Path]:
    """The weight files an index json names; each must be a plain file name inside `folder`."""
    index_path = folder / index_name
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _error(index_path, f"unreadable weight index ({_reason(exc)})") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise _error(index_path, "weight index has no 'weight_map'")
    names = set(weight_map.values())
    shards = []
    for name in sorted(map(str, names)):
        if name != Path(name).name or name in ("", ".", ".."):
            raise _error(index_path, f"weight index names a file outside the folder: {name!r}")
        shard = folder / name
        if not shard.is_file():
            raise _error(shard, f"weight shard listed in {index_name} is missing")
        shards.append(shard)
    return shards


def _weight_files(folder: Path) -> tuple[str, list[Path]]:
    """("safetensors" | "pickle", files): the weights load_checkpoint reads (safetensors preferred)."""
    if (folder / SAFE_INDEX).is_file():
        return "safetensors", _shards_from_index(folder, SAFE_INDEX)
    if (folder / SAFE_WEIGHTS).is_file():
        return "safetensors", [folder / SAFE_WEIGHTS]
    if (folder / PICKLE_INDEX).is_file():
        return "pickle", _shards_from_index(folder, PICKLE_INDEX)
    if (folder / PICKLE_WEIGHTS).is_file():
        return "pickle", [folder / PICKLE_WEIGHTS]
    pickles = sorted(p for p in folder.iterdir()
                     if p.suffix in (".bin", ".pt") and p.is_file() and not _NOT_WEIGHTS.match(p.name))
    if len(pickles) == 1 or (pickles and all(_SHARD.search(p.name) for p in pickles)):
        return "pickle", pickles
    if pickles:
        names = ", ".join(p.name for p in pickles)
        raise _error(folder, f"several candidate weight files and no index json ({names})")
    stray = sorted(p.name for p in folder.glob("*.safetensors"))
    if stray:
        raise _error(folder, f"no {SAFE_WEIGHTS} or {SAFE_INDEX} (found only {', '.join(stray)})")
    raise _error(folder, f"no weight files ({SAFE_WEIGHTS}, {SAFE_INDEX} or {PICKLE_WEIGHTS})")


def _read_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def checkpoint_hash(path: str | Path) -> str:
    """sha256 (hex) over the weight files (sorted by name) and config.json: the model's identity.

    The files hashed are the ones load_checkpoint loads; each enters as its name, its size and its
    bytes (streamed), so tokenizer files, READMEs or optimizer state do not change the hash.
    """
    folder = _checkpoint_dir(path)
    config = folder / CONFIG_NAME
    if not config.is_file():
        raise _error(folder, f"no {CONFIG_NAME}")
    _, weights = _weight_files(folder)
    digest = hashlib.sha256()
    for file in [*sorted(weights, key=lambda p: p.name), config]:
        try:
            size = file.stat().st_size
            digest.update(file.name.encode() + b"\0" + size.to_bytes(8, "little"))
            for chunk in _read_chunks(file):
                digest.update(chunk)
        except OSError as exc:
            raise _error(file, f"cannot read ({_reason(exc)})") from exc
    return digest.hexdigest()


def _check_safetensors(file: Path) -> None:
    """Open the file's header: a truncated or corrupt file fails here, named."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            f.keys()
    except Exception as exc:  # SafetensorError, OSError, ...
        raise _error(file, f"corrupt or truncated safetensors file ({_reason(exc)})") from exc


def _unwrap_state_dict(obj: Any) -> Any:
    """A bare state dict, or one wrapped as {"state_dict": ...} / {"model": ...} / {"module": ...}."""
    if isinstance(obj, dict) and len(obj) == 1:
        (key, value), = obj.items()
        if key in ("state_dict", "model", "module") and isinstance(value, dict):
            return value
    return obj


def _unpickling_reason(exc: BaseException) -> str:
    """The line of torch's weights-only refusal saying what was refused (not its advice to load unsafely)."""
    for line in str(exc).splitlines():
        if "GLOBAL" in line or "Unsupported" in line:
            return _one_line(line, limit=200)
    if "weights only" in str(exc).lower():
        return "weights-only load failed"
    return _one_line(str(exc), limit=200)


def _load_pickled_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """Merge the state dicts of `files`, read only with torch.load(weights_only=True)."""
    state: dict[str, torch.Tensor] = {}
    for file in files:
        kwargs: dict[str, Any] = {"mmap": True} if zipfile.is_zipfile(file) else {}
        try:
            with warnings.catch_warnings():  # torch's note on a foreign pickle protocol: the refusal says it
                warnings.simplefilter("ignore", UserWarning)
                obj = torch.load(file, map_location="cpu", weights_only=True, **kwargs)
        except pickle.UnpicklingError as exc:
            raise _error(file, "refusing to unpickle: the file holds objects other than tensors "
                               f"({_unpickling_reason(exc)}); convert it to safetensors") from exc
        except Exception as exc:
            raise _error(file, f"unreadable weights file ({_reason(exc)})") from exc
        obj = _unwrap_state_dict(obj)
        if not isinstance(obj, dict) or not obj:
            raise _error(file, f"not a state dict (a {type(obj).__name__})")
        for key, value in obj.items():
            if not isinstance(key, str) or not isinstance(value, torch.Tensor):
                raise _error(file, f"not a state dict (entry {key!r} is a {type(value).__name__})")
        state.update(obj)
    return state


# --------------------------------------------------------------------------------------------- config


def _load_config(folder: Path) -> Any:
    """config.json parsed and turned into a transformers config of a causal LM."""
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise _error(folder, f"no {CONFIG_NAME}")
    try:
        if config_path.stat().st_size > _MAX_CONFIG_BYTES:
            raise _error(config_path, f"implausibly large ({config_path.stat().st_size} bytes)")
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except CheckpointError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _error(config_path, f"not valid JSON ({_reason(exc)})") from exc
    if not isinstance(raw, dict):
        raise _error(config_path, "not a JSON object")
    limits.check_config_sizes(raw, config_path)  # before transformers builds anything from it
    if (field := nonfinite_config_field(raw)) is not None:  # e.g. layer_norm_epsilon NaN: every batch NaN
        raise _error(config_path, f"{field}: not a finite number")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise _error(config_path, "no 'model_type'")
    if model_type not in CONFIG_MAPPING:
        raise _error(folder, f"unknown model type {model_type!r} in {CONFIG_NAME} "
                             "(not built into this transformers version; remote code is never run)")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise _error(config_path, f"invalid config ({_reason(exc)})") from exc

    not_causal = f"model type {model_type!r} is not a causal language model"
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise _error(folder, not_causal)
    if getattr(config, "is_encoder_decoder", False):
        raise _error(folder, f"{not_causal} (encoder-decoder)")
    architectures = getattr(config, "architectures", None) or []
    if architectures and not _CAUSAL_LM_CLASSES.intersection(map(str, architectures)):
        raise _error(folder, f"{not_causal} (architectures: {', '.join(map(str, architectures))})")
    if not architectures and model_type in _ENCODER_TYPES and not getattr(config, "is_decoder", False):
        raise _error(folder, not_causal)
    return config


def _config_vocab_size(config: Any) -> int | None:
    for cfg in (config, config.get_text_config()):
        size = getattr(cfg, "vocab_size", None)
        if isinstance(size, int):
            return size
    return None


# --------------------------------------------------------------------------------------------- loading


def load_tokenizer(path: str | Path, tokenizer: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer alone (no weights read), as load_checkpoint returns it."""
    folder = _checkpoint_dir(path)
    return _load_tokenizer(folder, _load_config(folder), tokenizer)


def _check_memory(folder: Path, kind: str, files: list[Path], dtype: torch.dtype | None) -> None:
    """The weights' size in memory (safetensors headers; converted to ``dtype`` if given) against
    the memory available, before anything is allocated."""
    itemsize = torch.empty((), dtype=dtype).element_size() if dtype is not None else None
    limits.check_memory(folder, kind, files, itemsize)


TOKENIZER_HINT = ("; give a folder that has them with --tokenizer DIR (the base model's, say), or save them "
                  "with each checkpoint: Trainer(..., processing_class=tokenizer)")


def _load_tokenizer(folder: Path, config: Any, source: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``folder``, or of ``source`` when given (checkpoints saved without one)."""
    if source is not None:
        folder = Path(source)
        if not folder.is_dir():
            raise _error(folder, "the tokenizer folder given does not exist")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise _error(folder, f"no tokenizer files (none of {', '.join(TOKENIZER_FILES)})"
                             + ("" if source is not None else TOKENIZER_HINT))
    limits.check_tokenizer_size(folder, _config_vocab_size(config))
    try:
        with panics_as_one_line(str(folder), "the tokenizer failed while loading"):
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except TokenizerFailure:
        raise
    except Exception as exc:
        raise _error(folder, f"cannot load the tokenizer ({_reason(exc)})") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise _error(folder, f"the tokenizer is a {type(tokenizer).__name__}, not a text tokenizer")
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _shape_mismatches(model_class: type[PreTrainedModel], config: Any, kind: str, files: list[Path],
                      state: dict[str, torch.Tensor] | None,
                      expected: dict[str, tuple[int, ...]] | None = None) -> str:
    """Best-effort description of the first weights whose shape differs from what config.json builds
    (``expected``: the shapes, when the caller has already built the model on the meta device)."""
    try:
        if expected is None:
            with torch.device("meta"):
                built = model_class._from_config(config)
            expected = {k: tuple(v.shape) for k, v in built.state_dict().items()}
        found: dict[str, tuple[int, ...]] = {}
        if state is not None:
            found = {k: tuple(v.shape) for k, v in state.items()}
        elif kind == "safetensors":
            from safetensors import safe_open

            for file in files:
                with safe_open(str(file), framework="pt") as f:
                    names = f.keys()  # safe_open objects are not iterable
                    found.update({k: tuple(f.get_slice(k).get_shape()) for k in names})
        bad = [f"{k} is {list(found[k])} in the weights but {list(v)} per {CONFIG_NAME}"
               for k, v in expected.items() if k in found and found[k] != v]
    except Exception:
        return ""
    if not bad:
        return ""
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f": {bad[0]}{more}"


def _allowed_missing(model: PreTrainedModel, config: Any) -> set[str]:
    """lm_head.weight (or whatever the model ties) may be absent when the config ties embeddings."""
    text_config = config.get_text_config()
    if not getattr(text_config, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)):
        return set()
    tied = getattr(model, "_tied_weights_keys", None) or {}
    keys = set(tied) if isinstance(tied, dict | list | tuple | set) else set()
    output = model.get_output_embeddings()
    input_ = model.get_input_embeddings()
    if output is not None and input_ is not None and output.weight is input_.weight:
        keys |= {name for name, p in model.named_parameters(remove_duplicate=False) if p is output.weight}
    return keys


def _check_vocab(folder: Path, config: Any, tokenizer: PreTrainedTokenizerBase) -> None:
    vocab_size = _config_vocab_size(config)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise _error(folder, f"the tokenizer has {len(tokenizer)} tokens but {CONFIG_NAME} has vocab_size "
                             f"{vocab_size}: token ids past the embedding rows")
    limits.check_token_ids(folder, tokenizer.get_vocab(), vocab_size, f"vocab_size in {CONFIG_NAME}")


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


@contextlib.contextmanager
def _as_checkpoint_error(folder: Path) -> Iterator[None]:
    """Any failure inside becomes one CheckpointError line naming the folder."""
    try:
        yield
    except CheckpointError:
        raise
    except limits.LimitError as exc:
        raise CheckpointError(str(exc)) from exc
    except Exception as exc:
        raise _error(folder, f"cannot load the checkpoint ({type(exc).__name__}: {_reason(exc)})") from exc


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


# --------------------------------------------------------------------------------------------- saving


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
