"""A checkpoint's config.json, read into a transformers config of a causal LM (its sizes and
numbers checked before transformers builds anything from it), and what it says without a load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)
from transformers.utils import logging as hf_logging

from gnq_core.sources import limits
from gnq_core.sources.checkpoints.errors import CheckpointError, folder_error, reason
from gnq_core.sources.checkpoints.files import CONFIG_NAME, checkpoint_dir
from gnq_core.sources.checkpoints.values import nonfinite_config_field

MAX_CONFIG_BYTES = 16 * 2**20


# Model types whose causal-LM class is an encoder run as a decoder: only causal with is_decoder=True.
_ENCODER_TYPES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) & frozenset(MODEL_FOR_MASKED_LM_MAPPING_NAMES)


# Our own progress bars say what is happening; transformers' per-load bars would only add noise.
hf_logging.disable_progress_bar()


# A mapping value is one class name or several.
_CAUSAL_LM_CLASSES = frozenset(n for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
                               for n in ((v,) if isinstance(v, str) else v))


def quantisation(raw: dict[str, Any]) -> str | None:
    """What a config.json's ``quantization_config`` says the weights are (``"bitsandbytes, 4-bit"``),
    or None for a float model."""
    quant = raw.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, dict):
        return "quantization_config present"
    bits = ("4-bit" if quant.get("load_in_4bit") else "8-bit" if quant.get("load_in_8bit")
            else f"{quant['bits']}-bit" if isinstance(quant.get("bits"), int) else None)
    return ", ".join(str(x) for x in (quant.get("quant_method") or "quantization_config", bits) if x)


def load_config(folder: Path) -> Any:
    """config.json parsed and turned into a transformers config of a causal LM."""
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        raise folder_error(folder, f"no {CONFIG_NAME}")
    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise folder_error(config_path, f"implausibly large ({config_path.stat().st_size} bytes)")
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except CheckpointError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise folder_error(config_path, f"not valid JSON ({reason(exc)})") from exc
    if not isinstance(raw, dict):
        raise folder_error(config_path, "not a JSON object")
    limits.check_config_sizes(raw, config_path)  # before transformers builds anything from it
    limits.check_rope_scaling(raw, config_path)
    if (field := nonfinite_config_field(raw)) is not None:  # e.g. layer_norm_epsilon NaN: every batch NaN
        raise folder_error(config_path, f"{field}: not a finite number")
    if (quantised := quantisation(raw)) is not None:
        why = ("GNQ differentiates float weights exactly and quantised ones have no exact gradient; "
               "audit the model it was quantised from, or a dequantised copy")
        raise folder_error(config_path, f"a quantised model ({quantised}): {why}")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise folder_error(config_path, "no 'model_type'")
    if model_type not in CONFIG_MAPPING:
        raise folder_error(folder, f"unknown model type {model_type!r} in {CONFIG_NAME} "
                                   "(not built into this transformers version; remote code is never run)")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        raise folder_error(config_path, f"invalid config ({reason(exc)})") from exc

    not_causal = f"model type {model_type!r} is not a causal language model"
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise folder_error(folder, not_causal)
    if getattr(config, "is_encoder_decoder", False):
        raise folder_error(folder, f"{not_causal} (encoder-decoder)")
    architectures = getattr(config, "architectures", None) or []
    if architectures and not _CAUSAL_LM_CLASSES.intersection(map(str, architectures)):
        raise folder_error(folder, f"{not_causal} (architectures: {', '.join(map(str, architectures))})")
    if not architectures and model_type in _ENCODER_TYPES and not getattr(config, "is_decoder", False):
        raise folder_error(folder, not_causal)
    return config


def config_vocab_size(config: Any) -> int | None:
    """The vocabulary size a config states (its own, else its text config's), or None."""
    for cfg in (config, config.get_text_config()):
        size = getattr(cfg, "vocab_size", None)
        if isinstance(size, int):
            return size
    return None


def max_positions(path: str | Path) -> int | None:
    """The most tokens the checkpoint's model can read (max_position_embeddings in its config.json),
    or None when the config does not say (or cannot be read: check_checkpoint reports that)."""
    try:
        config = load_config(checkpoint_dir(path))
    except (CheckpointError, OSError):
        return None
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None
