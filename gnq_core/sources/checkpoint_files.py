"""A checkpoint folder's files, read without trusting them: its layout and weight files (safetensors
preferred; pickles only through ``torch.load(weights_only=True)``), its hash, its config, and
``CheckpointError``, the one error every checkpoint problem becomes."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig
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
from gnq_core.sources.weight_checks import nonfinite_config_field

CONFIG_NAME = "config.json"
ADAPTER_CONFIG = "adapter_config.json"  # a PEFT adapter checkpoint (sources/adapters.py)
ADAPTER_WEIGHTS = "adapter_model.safetensors"


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
    limits.check_rope_scaling(raw, config_path)
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


# The helpers other source modules may use (sources/adapters.py), under public names.
folder_error = _error
load_config = _load_config
read_chunks = _read_chunks
reason = _reason
