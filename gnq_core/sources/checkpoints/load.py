"""Loading a checkpoint: its model and tokenizer, checked on the way (``check_checkpoint``'s checks,
then the ones only a load can make), never running code from the folder."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from gnq_core.sources import limits
from gnq_core.sources.checkpoints.checks import check_vocab, check_weights, loading_problem, shape_mismatch
from gnq_core.sources.checkpoints.config import load_config
from gnq_core.sources.checkpoints.errors import CheckpointError, as_checkpoint_error, folder_error, reason
from gnq_core.sources.checkpoints.files import checkpoint_dir, weight_files
from gnq_core.sources.checkpoints.tokenizer import read_tokenizer


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
    folder = checkpoint_dir(path)
    with as_checkpoint_error(folder):
        return _load(folder, device=device, dtype=dtype, allow_pickle_weights=allow_pickle_weights,
                     tokenizer=tokenizer)


def _load(folder: Path, *, device: torch.device | str, dtype: torch.dtype | None,
          allow_pickle_weights: bool, tokenizer: str | Path | None = None,
          ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    config = load_config(folder)
    kind, files = weight_files(folder)
    if kind == "pickle" and not allow_pickle_weights:
        names = ", ".join(f.name for f in files)
        raise folder_error(folder, f"only pickled weights ({names}) and allow_pickle_weights=False; "
                             "convert them to safetensors")

    tokenizer = read_tokenizer(folder, config, tokenizer)
    check_vocab(folder, config, tokenizer)

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
        state = check_weights(folder, kind, files, dtype)
        if state is None:
            model, info = model_class.from_pretrained(folder, use_safetensors=True, **common)
        else:
            model, info = model_class.from_pretrained(None, state_dict=state, **common)
    except (CheckpointError, limits.LimitError):
        raise
    except Exception as exc:
        if problem := shape_mismatch(exc, model_class, config, kind, files, state):
            raise folder_error(folder, problem) from exc
        where = files[0] if len(files) == 1 else folder
        raise folder_error(where, f"cannot load the weights ({type(exc).__name__}: {reason(exc)})") from exc

    if problem := loading_problem(model, config, info):
        raise folder_error(folder, problem)
    unexpected = sorted(map(str, info.get("unexpected_keys") or ()))
    if unexpected:
        warnings.warn(f"{folder}: {len(unexpected)} weights not used by the model (e.g. {unexpected[0]})",
                      stacklevel=3)

    rows = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > rows:
        raise folder_error(folder, f"the tokenizer has {len(tokenizer)} tokens but the model has {rows} "
                             "embedding rows")
    limits.check_token_ids(folder, tokenizer.get_vocab(), rows, "the model's number of embedding rows")

    model = model.to(device=device) if dtype is None else model.to(device=device, dtype=dtype)
    model.eval()
    return model, tokenizer
