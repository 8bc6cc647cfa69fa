"""A checkpoint folder's layout, read without trusting it: the file names, which weight files a
load reads (safetensors preferred), ``CheckpointRef``, the hash, the parameter count."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gnq_core.sources import limits
from gnq_core.sources.checkpoints.errors import CheckpointError, folder_error, reason
from gnq_core.sources.links import LinkError, check_folder_links

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
IN_PROGRESS = re.compile(r"\.(tmp|old)-\d+$")
_CHUNK = 2**20


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


def checkpoint_dir(path: str | Path) -> Path:
    """``path`` as a checkpoint folder: it exists, is a folder, and has no link out of it."""
    folder = Path(path)
    if not folder.exists():
        raise folder_error(folder, "no such checkpoint folder")
    if not folder.is_dir():
        raise folder_error(folder, "not a checkpoint folder (not a directory)")
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
        raise folder_error(index_path, f"unreadable weight index ({reason(exc)})") from exc
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise folder_error(index_path, "weight index has no 'weight_map'")
    names = set(weight_map.values())
    shards = []
    for name in sorted(map(str, names)):
        if name != Path(name).name or name in ("", ".", ".."):
            raise folder_error(index_path, f"weight index names a file outside the folder: {name!r}")
        shard = folder / name
        if not shard.is_file():
            raise folder_error(shard, f"weight shard listed in {index_name} is missing")
        shards.append(shard)
    return shards


def weight_files(folder: Path) -> tuple[str, list[Path]]:
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
        raise folder_error(folder, f"several candidate weight files and no index json ({names})")
    stray = sorted(p.name for p in folder.glob("*.safetensors"))
    if stray:
        raise folder_error(folder, f"no {SAFE_WEIGHTS} or {SAFE_INDEX} (found only {', '.join(stray)})")
    raise folder_error(folder, f"no weight files ({SAFE_WEIGHTS}, {SAFE_INDEX} or {PICKLE_WEIGHTS})")


def hash_files(files: Iterable[Path]) -> str:
    """sha256 (hex) over the files in the order given, each as its name, its size and its bytes
    (streamed, a MiB at a time)."""
    digest = hashlib.sha256()
    for file in files:
        try:
            digest.update(file.name.encode() + b"\0" + file.stat().st_size.to_bytes(8, "little"))
            with file.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            raise folder_error(file, f"cannot read ({reason(exc)})") from exc
    return digest.hexdigest()


def checkpoint_hash(path: str | Path) -> str:
    """sha256 (hex) over the weight files (sorted by name) and config.json: the model's identity.

    The files hashed are the ones load_checkpoint loads; each enters as its name, its size and its
    bytes (streamed), so tokenizer files, READMEs or optimizer state do not change the hash.
    """
    folder = checkpoint_dir(path)
    config = folder / CONFIG_NAME
    if not config.is_file():
        raise folder_error(folder, f"no {CONFIG_NAME}")
    _, weights = weight_files(folder)
    return hash_files([*sorted(weights, key=lambda p: p.name), config])


def parameter_count(path: str | Path) -> int | None:
    """The model's number of parameters without loading it: the elements its safetensors headers
    list, else its pickled weight files' bytes over 4 (float32); None when the folder has no
    readable weights (check_checkpoint reports why)."""
    try:
        kind, files = weight_files(checkpoint_dir(path))
        if kind == "safetensors":
            return limits.weights_elements(files)
        return sum(f.stat().st_size for f in files) // 4
    except (CheckpointError, OSError, ValueError, struct.error):
        return None
