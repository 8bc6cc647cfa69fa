"""Sanity bounds on a checkpoint, checked before anything is built, parsed or allocated.

A hostile (or mistyped) ``config.json`` can ask for a billion layers, a tokenizer file can hold
millions of entries or ids past the embedding, a safetensors header can declare tensors larger than
the machine's memory.  Each check here is cheap (no model is built, no weight read) and raises
``LimitError`` with one line naming the file.  The bounds are stated below and can be raised through
environment variables (a real model beyond them is larger than any published causal LM).
"""

from __future__ import annotations

import json
import math
import os
import resource
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnq_core.errors import GNQError

__all__ = ["BOUNDS", "LimitError", "Bound", "available_memory", "check_config_sizes", "check_memory",
           "check_token_ids", "check_tokenizer_size", "env_int", "format_bytes", "tensor_shapes",
           "weights_bytes"]


class LimitError(GNQError, ValueError):
    """A checkpoint beyond a stated bound; the message is one line naming the file."""


@dataclass(frozen=True)
class Bound:
    """Config fields of one kind (any of ``keys``, at any depth), each a whole number in 1..limit."""

    what: str
    keys: frozenset[str]
    default: int
    env: str

    @property
    def limit(self) -> int:
        return env_int(self.env, self.default)


# The largest published causal LMs: 126 layers, width 16384 (ffn 53248), 128 heads, vocab 262144.
BOUNDS = (
    Bound("layers", frozenset({"n_layer", "n_layers", "num_hidden_layers", "num_layers",
                               "num_decoder_layers"}), 1024, "GNQ_MAX_LAYERS"),
    Bound("width", frozenset({"n_embd", "hidden_size", "d_model", "n_inner", "intermediate_size", "ffn_dim",
                              "d_ff", "head_dim"}), 262_144, "GNQ_MAX_WIDTH"),
    Bound("heads", frozenset({"n_head", "num_attention_heads", "num_key_value_heads", "num_heads",
                              "n_kv_heads"}), 1024, "GNQ_MAX_HEADS"),
    Bound("vocabulary", frozenset({"vocab_size"}), 4_194_304, "GNQ_MAX_VOCAB"),
    Bound("positions", frozenset({"n_positions", "n_ctx", "max_position_embeddings"}), 16_777_216,
          "GNQ_MAX_POSITIONS"),
)
_MAX_DEPTH = 4  # text_config inside a multimodal config, and so on

# Files AutoTokenizer may parse; their total size is bounded before any is read.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "merges.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json",
                   "special_tokens_map.json")
# Real tokenizers take < 130 bytes per vocabulary entry (Gemma 3: 33 MB for 262k entries) and
# < 20 MB for small vocabularies.  Beyond this the file holds far more than the model can use;
# parsing a 2M-entry vocabulary took 1.37 GB of memory (measured).
TOKENIZER_BYTES_PER_ENTRY = 256
TOKENIZER_MIN_BYTES = 32 * 2**20
TOKENIZER_MAX_BYTES = 128 * 2**20

_SAFETENSORS_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                         "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
                         "F8_E8M0": 1, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1, "C64": 8}
_FLOATING = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"}
_MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


def env_int(name: str, default: int, *, unit: str = "a whole number") -> int:
    """A bound from the environment variable ``name``, else ``default``."""
    value = os.environ.get(name)
    try:
        return int(value) if value else default
    except ValueError:
        raise LimitError(f"{name} must be {unit}, got {value!r}") from None


def format_bytes(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


# --------------------------------------------------------------------------------------------- config


def _fields(raw: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterator[tuple[str, str, Any]]:
    """(key, dotted name, value) of every entry, nested dicts (text_config, ...) included."""
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < _MAX_DEPTH:
            yield from _fields(value, f"{name}.", depth + 1)
        else:
            yield str(key), name, value


def check_config_sizes(raw: dict[str, Any], config_path: Path) -> None:
    """Every layer count, width, head count, vocabulary and position count in the parsed
    config.json is a whole number from 1 to its bound (``BOUNDS``); ``null`` leaves the model's
    default.  Runs on the JSON, before transformers builds a config or a model."""
    for key, name, value in _fields(raw):
        for bound in BOUNDS:
            if key not in bound.keys or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LimitError(f"{config_path}: {name} is {json.dumps(value)}; it must be a positive "
                                 f"whole number")
            if value > bound.limit:
                raise LimitError(f"{config_path}: {name} is {value:,}, above the limit of {bound.limit:,} "
                                 f"{bound.what} ({bound.env} raises it)")


# Rotary-embedding scaling (``rope_scaling`` / ``rope_parameters``, nested per layer type too): the
# fields transformers divides by or takes the log of.  Out of range, it warns and goes on, or fails
# with "division by zero"; here they are refused with the rule.  (field, lowest, lowest allowed?)
ROPE_KEYS = ("rope_scaling", "rope_parameters")
ROPE_FIELDS = {"factor": (1.0, True), "attention_factor": (0.0, False), "beta_fast": (0.0, False),
               "beta_slow": (0.0, False), "low_freq_factor": (0.0, False), "high_freq_factor": (0.0, False),
               "mscale": (0.0, True), "mscale_all_dim": (0.0, True)}


def check_rope_scaling(raw: dict[str, Any], config_path: Path) -> None:
    """Each rotary scaling field of config.json is a number in its range: ``factor`` at least 1,
    the others above (mscale: at least) 0; ``null`` leaves the default.  (``rope_type`` is left to
    transformers: older configs name types by aliases it maps, "su" or "mrope".)"""
    for key, name, value in _fields(raw):
        if value is None or not any(k in ROPE_KEYS for k in name.split(".")[:-1]):
            continue
        if key not in ROPE_FIELDS:
            continue
        lowest, inclusive = ROPE_FIELDS[key]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < lowest or (value == lowest and not inclusive):
            rule = f"of at least {lowest:g}" if inclusive else f"above {lowest:g}"
            raise LimitError(f"{config_path}: {name} is {json.dumps(value)}; rotary scaling needs a number "
                             f"{rule}")


# --------------------------------------------------------------------------------------------- tokenizer


def check_tokenizer_size(folder: Path, vocab_size: int | None) -> None:
    """The tokenizer files together are at most ``GNQ_MAX_TOKENIZER_BYTES`` (default: 256 bytes
    per vocabulary entry of config.json, at least 32 MiB, at most 128 MiB), checked before any is
    parsed."""
    files = [(folder / name) for name in TOKENIZER_FILES if (folder / name).is_file()]
    total = sum(f.stat().st_size for f in files)
    scaled = min(TOKENIZER_MAX_BYTES, TOKENIZER_BYTES_PER_ENTRY * (vocab_size or 0))
    default = max(TOKENIZER_MIN_BYTES, scaled)
    limit = env_int("GNQ_MAX_TOKENIZER_BYTES", default)
    if total > limit:
        biggest = max(files, key=lambda f: f.stat().st_size)
        raise LimitError(f"{biggest}: tokenizer files of {format_bytes(total)}, more than the "
                         f"{format_bytes(limit)} a vocabulary of {vocab_size or 'unknown'} entries needs; "
                         "refused before parsing (GNQ_MAX_TOKENIZER_BYTES raises the limit)")


def check_token_ids(folder: Path, vocab: dict[str, int], rows: int | None, what: str) -> None:
    """Every id the tokenizer can produce (``vocab``: token -> id, added tokens included) indexes
    one of the model's ``rows`` embedding rows (``what`` says where that number comes from)."""
    if rows is None or not vocab:
        return
    token, top = max(vocab.items(), key=lambda kv: kv[1])
    if top >= rows or min(vocab.values()) < 0:
        bad = (token, top) if top >= rows else min(vocab.items(), key=lambda kv: kv[1])
        raise LimitError(f"{folder}: the tokenizer maps {bad[0]!r} to id {bad[1]:,} but {what} is {rows:,}: "
                         "token ids past the embedding rows")


# --------------------------------------------------------------------------------------------- memory


def weights_bytes(kind: str, files: Iterable[Path], itemsize: int | None = None) -> int:
    """Bytes the weights take once loaded: from the safetensors headers (elements x element size,
    floating tensors at ``itemsize`` when the load converts them), or the pickled files' sizes."""
    total = 0
    for file in files:
        if kind != "safetensors":
            total += file.stat().st_size
            continue
        for dtype, elements in _safetensors_tensors(file):
            size = itemsize if itemsize and dtype in _FLOATING else _SAFETENSORS_ITEMSIZE.get(dtype, 8)
            total += elements * size
    return total


def _safetensors_entries(file: Path) -> Iterator[tuple[str, Any, list[int]]]:
    """(name, dtype, shape) of each tensor a safetensors file's header lists."""
    with file.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > _MAX_HEADER_BYTES:
            raise ValueError("header too large")
        header = json.loads(f.read(length))
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r} has shape {shape!r}")
        yield name, entry.get("dtype"), shape


def _safetensors_tensors(file: Path) -> Iterator[tuple[Any, int]]:
    """(dtype, number of elements) of each tensor a safetensors file's header lists."""
    for _, dtype, shape in _safetensors_entries(file):
        yield dtype, math.prod(shape)


def tensor_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape by name, from the safetensors files' headers alone (nothing loaded)."""
    return {name: tuple(shape) for file in files for name, _, shape in _safetensors_entries(file)}


def weights_elements(files: Iterable[Path]) -> int:
    """Numbers stored in safetensors files (the model's parameters), from their headers alone."""
    return sum(elements for file in files for _, elements in _safetensors_tensors(file))


_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def stored_float_dtype(files: Iterable[Path]) -> str | None:
    """The floating dtype most of the weights' elements are stored in ("bfloat16", "float32", ...),
    from the safetensors headers; None when there is none of the four (an 8-bit checkpoint)."""
    counts: dict[str, int] = {}
    for file in files:
        for dtype, elements in _safetensors_tensors(file):
            if dtype in _DTYPE_NAMES:
                counts[_DTYPE_NAMES[dtype]] = counts.get(_DTYPE_NAMES[dtype], 0) + elements
    return max(counts, key=lambda k: counts[k]) if counts else None


def _cgroup_room() -> int | None:
    """Memory this process's cgroup may still take (v2, else v1), or None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text(encoding="utf-8").strip()
            usage = int(Path(usage_file).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue
        if limit.isascii() and limit.isdigit() and int(limit) < 2**60:
            return max(0, int(limit) - usage)
    return None


def _address_space_room() -> int | None:
    """Room left under ``ulimit -v`` (RLIMIT_AS), or None without one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    import psutil

    return max(0, soft - psutil.Process().memory_info().vms)


def available_memory() -> tuple[int, str]:
    """(bytes, where the number comes from): the least of ``GNQ_MAX_MEMORY``, the memory the
    system says is available, the cgroup's room and the room under ``ulimit -v``."""
    import psutil

    candidates = [(psutil.virtual_memory().available, "available memory")]
    if (cgroup := _cgroup_room()) is not None:
        candidates.append((cgroup, "the memory limit of this container"))
    if (space := _address_space_room()) is not None:
        candidates.append((space, "room under ulimit -v"))
    if os.environ.get("GNQ_MAX_MEMORY"):
        candidates.append((env_int("GNQ_MAX_MEMORY", 0), "GNQ_MAX_MEMORY"))
    return min(candidates)


def check_memory(where: Path, kind: str, files: list[Path], itemsize: int | None = None) -> None:
    """Refuse, before loading, weights that need more memory than there is."""
    try:
        need = weights_bytes(kind, files, itemsize)
    except (OSError, ValueError, struct.error):
        return  # an unreadable header is reported, named, by the safetensors check
    room, source = available_memory()
    if need > room:
        raise LimitError(f"{where}: the weights need {format_bytes(need)} of memory to load (from the "
                         f"{'safetensors headers' if kind == 'safetensors' else 'weight files'}) but "
                         f"{source} is {format_bytes(room)}; refused before loading")
