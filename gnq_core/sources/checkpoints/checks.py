"""Checking a checkpoint short of reading its weights (``check_checkpoint``), and the checks a load
shares with it: memory and weight files, weight shapes and the tied weights allowed missing, vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.utils import logging as hf_logging

from gnq_core.sources import limits
from gnq_core.sources.checkpoints.config import config_vocab_size, load_config
from gnq_core.sources.checkpoints.errors import as_checkpoint_error, folder_error, reason
from gnq_core.sources.checkpoints.files import CONFIG_NAME, checkpoint_dir, weight_files
from gnq_core.sources.checkpoints.formats import check_safetensors, load_pickled_weights, meta_state
from gnq_core.sources.checkpoints.tokenizer import read_tokenizer
from gnq_core.sources.checkpoints.values import integer_weight, nonfinite_tensor


def check_weights(folder: Path, kind: str, files: list[Path],
                  dtype: torch.dtype | None) -> dict[str, torch.Tensor] | None:
    """The weights' size in memory (safetensors headers; converted to ``dtype`` if given) against
    the memory available, before anything is allocated; then each safetensors header, or the
    pickled weights loaded weights-only (memory-mapped: anything but tensors refused), returned."""
    itemsize = torch.empty((), dtype=dtype).element_size() if dtype is not None else None
    limits.check_memory(folder, kind, files, itemsize)  # before safetensors maps the file
    if kind != "safetensors":
        return load_pickled_weights(files)
    for file in files:
        check_safetensors(file)
    return None


def shape_mismatch(exc: Exception, model_class: type[PreTrainedModel], config: Any, kind: str,
                   files: list[Path], state: dict[str, torch.Tensor] | None) -> str | None:
    """``from_pretrained``'s failure ``exc`` as the problem when it is about weight shapes, else None."""
    text = str(exc).lower()
    if "ignore_mismatched_sizes" not in text and "size mismatch" not in text:
        return None
    detail = _first_mismatch(model_class, config, kind, files, state)
    return f"weights do not match {CONFIG_NAME} (shape mismatch{detail})"


def _first_mismatch(model_class: type[PreTrainedModel], config: Any, kind: str, files: list[Path],
                    state: dict[str, torch.Tensor] | None) -> str:
    """Best-effort description of the first weights whose shape differs from what config.json builds."""
    try:
        with torch.device("meta"):
            built = model_class._from_config(config)
        expected = {k: tuple(v.shape) for k, v in built.state_dict().items()}
        if state is None and kind == "safetensors":
            state = meta_state(files)  # names and shapes from the headers
        found = {k: tuple(v.shape) for k, v in (state or {}).items()}
        bad = [f"{k} is {list(found[k])} in the weights but {list(v)} per {CONFIG_NAME}"
               for k, v in expected.items() if k in found and found[k] != v]
    except Exception:
        return ""
    if not bad:
        return ""
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return f": {bad[0]}{more}"


def allowed_missing(model: PreTrainedModel, config: Any) -> set[str]:
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


def loading_problem(model: PreTrainedModel, config: Any, info: dict[str, Any]) -> str:
    """What ``from_pretrained``'s loading info says is wrong with the weights: shapes that do not
    match the config, or weights missing that the model does not tie ("" if none)."""
    if info.get("mismatched_keys"):
        keys = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info["mismatched_keys"])
        return f"weights do not match {CONFIG_NAME} (shape mismatch: {', '.join(keys[:3])})"
    missing = sorted(set(map(str, info.get("missing_keys") or ())) - allowed_missing(model, config))
    more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
    return f"weights do not match {CONFIG_NAME}: missing {', '.join(missing[:3])}{more}" if missing else ""


def check_vocab(folder: Path, config: Any, tokenizer: PreTrainedTokenizerBase) -> None:
    """The tokenizer's ids fit the config's vocabulary (its embedding rows)."""
    vocab_size = config_vocab_size(config)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise folder_error(folder, f"the tokenizer has {len(tokenizer)} tokens but {CONFIG_NAME} has "
                                   f"vocab_size {vocab_size}: token ids past the embedding rows")
    limits.check_token_ids(folder, tokenizer.get_vocab(), vocab_size, f"vocab_size in {CONFIG_NAME}")


def check_checkpoint(path: str | Path, max_length: int | None = None,
                     dtype: torch.dtype | None = None, tokenizer: str | Path | None = None) -> None:
    """What load_checkpoint checks, short of reading the weights: config.json (a causal LM with at
    least ``max_length`` positions), the weight files (safetensors headers: names and shapes against
    the config), the tokenizer and its size.  Cheap enough to run on every checkpoint of a series
    before an audit writes anything.  Also the sanity bounds of gnq_core.sources.limits: sizes in
    config.json, tokenizer file size and ids, and the weights' memory (in ``dtype``, if given)
    against the memory available."""
    folder = checkpoint_dir(path)
    with as_checkpoint_error(folder):
        config = load_config(folder)
        positions = getattr(config.get_text_config(), "max_position_embeddings", None)
        if max_length is not None and isinstance(positions, int) and max_length > positions:
            raise folder_error(folder, f"--max-length {max_length} is more than the {positions} positions "
                                       f"the model has (max_position_embeddings in {CONFIG_NAME}); use "
                                       f"--max-length {positions} or less")
        kind, files = weight_files(folder)
        check_weights(folder, kind, files, dtype)
        check_vocab(folder, config, read_tokenizer(folder, config, tokenizer))
        if kind == "safetensors" and (problem := _header_problem(folder, config, files)):
            raise folder_error(folder, problem)
        if kind == "safetensors" and (where := nonfinite_tensor(files)) is not None:
            raise folder_error(folder, f"{where} holds NaN or infinite values: every batch would be "
                                       "non-finite")


def _header_problem(folder: Path, config: Any, files: list[Path]) -> str:
    """Weights transformers would not load cleanly, per the safetensors headers ("" if none).

    Asks transformers itself: ``from_pretrained`` on the meta device with empty meta tensors
    named and shaped as in the files, so its own key renames (GPT-NeoX's ``embed_out``), weight
    conversions (Mixtral's per-expert layout) and tied weights apply, and nothing is allocated.
    A weight it would have to initialise (missing) or cannot convert is a problem; weights it
    does not use are left to the load (a warning)."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    state = meta_state(files)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its loading report is ours to word, in one line
    try:
        model, info = model_class.from_pretrained(None, config=config, state_dict=state, device_map="meta",
                                                  output_loading_info=True, ignore_mismatched_sizes=False)
    except Exception as exc:
        return (shape_mismatch(exc, model_class, config, "safetensors", files, None)
                or f"weights do not match {CONFIG_NAME} ({type(exc).__name__}: {reason(exc)})")
    finally:
        hf_logging.set_verbosity(verbosity)
    if problem := loading_problem(model, config, info):
        return problem
    if (stored := integer_weight(state, [name for name, _ in model.named_parameters()])) is not None:
        return f"weights do not match {CONFIG_NAME}: {stored}"
    return ""
