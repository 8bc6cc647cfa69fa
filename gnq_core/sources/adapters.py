"""PEFT adapter checkpoints (LoRA and the other adapters PEFT saves): found, checked against a
base model and loaded onto it, for post-hoc audits.

A Trainer run of a ``PeftModel`` saves ``checkpoint-*/`` with ``adapter_config.json`` and
``adapter_model.safetensors`` and no full model.  GNQ of such a checkpoint is measured over the
adapter's trainable parameters (``Adapters(merged=False)``): the quantity ``GNQTrainer`` measures
in-run on the same PeftModel, so in-run and post-hoc numbers of one run compare.  With
``merged=True`` the adapter is merged into the base and GNQ is over all parameters of the merged
model (a far larger quantity: every base weight's gradient counts).

Like checkpoint folders, adapter folders are untrusted: the config is JSON, the weights are read
from safetensors only (a pickled ``adapter_model.bin`` is refused), nothing is fetched.  Every
problem is one ``CheckpointError`` line naming the folder.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gnq_core.sources import limits
from gnq_core.sources.adapter_patterns import check_adapter_patterns
from gnq_core.sources.checkpoints.config import MAX_CONFIG_BYTES, load_config
from gnq_core.sources.checkpoints.errors import CheckpointError, as_checkpoint_error, folder_error, reason
from gnq_core.sources.checkpoints.files import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CONFIG_NAME,
    CheckpointRef,
    checkpoint_dir,
    hash_files,
)
from gnq_core.sources.checkpoints.formats import meta_state
from gnq_core.sources.checkpoints.series import trailing_number

__all__ = ["Adapters", "adapter_hash", "check_adapter", "find_adapter_checkpoints", "is_adapter_checkpoint",
           "load_adapter_checkpoint", "load_model_at"]

PEFT_HINT = "pip install 'gnq-audit[peft]' (or pip install peft)"


@dataclass(frozen=True)
class Adapters:
    """How adapter checkpoints are audited: the base model folder they were trained from, and
    whether GNQ is over the adapter's parameters (False) or all parameters of the merged model."""

    base: Path
    merged: bool = False

    @property
    def parameters(self) -> str:
        return "merged model" if self.merged else "adapter"


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise CheckpointError(f"PEFT adapter checkpoints need the peft package: {PEFT_HINT}") from None
    return peft


@contextlib.contextmanager
def _peft_wrapping() -> Iterator[None]:
    """Around PEFT's wrapping of a model: PEFT (0.21) reads ``model.is_gradient_checkpointing``,
    which transformers deprecates for ``is_activation_checkpointing`` (a FutureWarning on stderr,
    under ``--quiet`` too, at every adapter load).  That one warning is PEFT's to fix; only it is
    silenced, only here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield


def is_adapter_folder(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file()


def is_adapter_checkpoint(path: str | Path) -> bool:
    """A PEFT adapter checkpoint: an adapter_config.json and no full model's config.json."""
    folder = Path(path)
    return is_adapter_folder(folder) and not (folder / CONFIG_NAME).is_file()


def find_adapter_checkpoints(directory: str | Path) -> list[CheckpointRef]:
    """The adapter checkpoints in ``directory`` in training order: its subfolders with an
    adapter_config.json by the number their name ends with (checkpoint-2 before checkpoint-10),
    the unnumbered ones after; the folder itself when it is one and has none.  A Trainer's final
    save at the top of its output folder counts only when it differs from the last checkpoint."""
    root = Path(directory)
    if not root.is_dir():
        raise folder_error(root, "no such directory" if not root.exists() else "not a directory")
    root = root.resolve()
    try:
        subs = sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                       and is_adapter_folder(p)), key=lambda p: p.name)
    except OSError as exc:
        raise folder_error(root, f"cannot list the directory ({reason(exc)})") from exc
    numbered = sorted(((n, p) for p in subs if (n := trailing_number(p.name)) is not None),
                      key=lambda t: (t[0], t[1].name))
    unnumbered = [p for p in subs if trailing_number(p.name) is None]
    refs = [CheckpointRef(label=p.name, path=p, order=n) for n, p in numbered]
    start = numbered[-1][0] + 1 if numbered else 0
    refs += [CheckpointRef(label=p.name, path=p, order=start + i) for i, p in enumerate(unnumbered)]
    if is_adapter_folder(root):
        checkpoint_dir(root)  # its files are hashed below: none may link out of it
    if is_adapter_folder(root) and (not refs or adapter_hash(root) != adapter_hash(refs[-1].path)):
        refs.append(CheckpointRef(label=root.name, path=root, order=(refs[-1].order + 1) if refs else 0))
    if not refs:
        raise folder_error(root, f"no adapter checkpoints (no {ADAPTER_CONFIG} here or in any subfolder)")
    return refs


def _adapter_files(folder: Path) -> tuple[dict[str, Any], Path]:
    """The adapter's config (JSON) and its safetensors weights, or a CheckpointError: checked as a
    checkpoint folder's are (a folder, no link out of it, a config of a plausible size)."""
    checkpoint_dir(folder)
    config_path = folder / ADAPTER_CONFIG
    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise folder_error(config_path, f"implausibly large ({config_path.stat().st_size} bytes)")
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise folder_error(config_path, f"cannot read the config ({reason(exc)})") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("peft_type"), str):
        raise folder_error(folder / ADAPTER_CONFIG, "not a PEFT adapter config (no peft_type)")
    weights = folder / ADAPTER_WEIGHTS
    if not weights.is_file():
        pickled = (folder / "adapter_model.bin").is_file()
        why = " (adapter_model.bin is pickled and not read: save with safe_serialization=True)"
        raise folder_error(folder, f"no {ADAPTER_WEIGHTS}" + (why if pickled else ""))
    return raw, weights


def adapter_hash(folder: str | Path) -> str:
    """sha256 over adapter_config.json and adapter_model.safetensors: the adapter's identity."""
    folder = Path(folder)
    return hash_files([folder / ADAPTER_WEIGHTS, folder / ADAPTER_CONFIG])


def _peft_config(folder: Path, raw: dict[str, Any]) -> Any:
    peft = _peft()
    try:
        config_class = peft.PEFT_TYPE_TO_CONFIG_MAPPING[raw["peft_type"]]
    except KeyError:
        raise folder_error(folder / ADAPTER_CONFIG, f"unknown PEFT type {raw['peft_type']!r}") from None
    try:
        config = config_class.from_peft_type(**raw)
    except Exception as exc:
        raise folder_error(folder / ADAPTER_CONFIG,
                     f"not a valid {raw['peft_type']} config ({reason(exc)})") from exc
    if config.is_prompt_learning or config.is_adaption_prompt:
        # virtual tokens or prompts added to the input, not weights of the model: GNQ's gradients
        # are over the model's own layers, and loading such an adapter for an audit fails
        raise folder_error(folder / ADAPTER_CONFIG,
                           f"a {raw['peft_type']} adapter (learned prompt tokens), which an audit cannot "
                           "measure: only adapters of the model's weights (LoRA, DoRA, IA3, ...) are audited")
    return config


def check_adapter(folder: str | Path, base: str | Path) -> None:
    """The adapter fits the base (checked with ``check_checkpoint`` on its own): PEFT wraps a
    weightless (meta) copy of the base with the adapter's config, and every stored adapter tensor
    must be one the wrapped model has, with its shape, and none missing.  Cheap: no weights read."""
    folder, base = Path(folder), Path(base)
    raw, weights = _adapter_files(folder)
    config = _peft_config(folder, raw)
    from transformers import AutoModelForCausalLM

    with as_checkpoint_error(folder):
        limits.check_memory(folder, "safetensors", [weights])
    try:
        stored = {k: tuple(v.shape) for k, v in meta_state([weights]).items()}
    except Exception as exc:
        raise folder_error(weights, f"cannot read the adapter weights ({reason(exc)})") from exc
    peft = _peft()
    mismatch = f"does not fit the base model {base}"
    base_config = load_config(base)
    try:
        with torch.device("meta"), _peft_wrapping():
            base_model = AutoModelForCausalLM.from_config(base_config)
            # PEFT matches the config's regexes against these names: tried first, with a time limit
            check_adapter_patterns(folder / ADAPTER_CONFIG, raw, [n for n, _ in base_model.named_modules()])
            model = peft.get_peft_model(base_model, config)
    except CheckpointError:
        raise
    except (ValueError, KeyError, RuntimeError, TypeError) as exc:
        raise folder_error(folder, f"{mismatch} ({reason(exc)}); give the model it was trained from with "
                             "--base-model") from exc
    expected = {k: tuple(v.shape) for k, v in peft.get_peft_model_state_dict(model).items()}
    unknown = sorted(set(stored) - set(expected))
    shapes = sorted(k for k in set(stored) & set(expected) if stored[k] != expected[k])
    missing = sorted(set(expected) - set(stored))
    for keys, what in ((unknown, "has no place for"), (shapes, "has other shapes for"), (missing, "misses")):
        if keys:
            more = f" (+{len(keys) - 2} more)" if len(keys) > 2 else ""
            raise folder_error(folder, f"{mismatch}: it {what} {', '.join(keys[:2])}{more}; give the model "
                                 "it was trained from with --base-model")


def load_adapter_checkpoint(folder: str | Path, adapters: Adapters, *, device: torch.device | str = "cpu",
                            dtype: torch.dtype | None = None, tokenizer: str | Path | None = None,
                            ) -> tuple[torch.nn.Module, Any]:
    """The base model with the adapter of ``folder`` applied, in eval mode on ``device`` in
    ``dtype``, and the base's tokenizer (or ``tokenizer``'s).  Unmerged: only the adapter's
    parameters require gradients (GNQ over them); merged: every parameter of the merged model does."""
    from gnq_core.sources.checkpoints.load import load_checkpoint

    folder = Path(folder)
    raw, _ = _adapter_files(folder)
    _peft_config(folder, raw)
    model, tok = load_checkpoint(adapters.base, device=device, dtype=dtype, tokenizer=tokenizer)
    check_adapter_patterns(folder / ADAPTER_CONFIG, raw, [name for name, _ in model.named_modules()])
    peft = _peft()
    try:
        with _peft_wrapping():
            wrapped = peft.PeftModel.from_pretrained(model, str(folder), is_trainable=True,
                                                     autocast_adapter_dtype=False)
    except Exception as exc:
        raise folder_error(folder, f"cannot apply the adapter to {adapters.base} ({reason(exc)})") from exc
    wrapped.to(device=device, dtype=dtype or next(model.parameters()).dtype)
    if adapters.merged:
        merged = wrapped.merge_and_unload()
        for p in merged.parameters():
            p.requires_grad_(True)
        return merged.eval(), tok
    return wrapped.eval(), tok


def load_model_at(path: str | Path, base: str | None, *, device: torch.device | str = "cpu",
                  dtype: torch.dtype | None = None, tokenizer: str | Path | None = None,
                  ) -> tuple[torch.nn.Module, Any]:
    """A full checkpoint, or an adapter checkpoint merged into ``base`` (a run's
    ``settings["base_model"]``): for what reads a model's outputs only (an attack's decoding)."""
    from gnq_core.sources.checkpoints.load import load_checkpoint

    if base is not None and is_adapter_checkpoint(path):
        return load_adapter_checkpoint(path, Adapters(Path(base), merged=True), device=device, dtype=dtype,
                                       tokenizer=tokenizer)
    return load_checkpoint(path, device=device, dtype=dtype, tokenizer=tokenizer)
