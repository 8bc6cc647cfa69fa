"""The checks that checking and loading a checkpoint share: memory, tokenizer, weight shapes and
vocabulary, and turning what a load raises into one ``CheckpointError`` line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from gnq_core.sources import limits
from gnq_core.sources.checkpoint_files import (
    CONFIG_NAME,
    TOKENIZER_FILES,
    CheckpointError,
    _config_vocab_size,
    _error,
    _reason,
)
from gnq_core.sources.library_logs import library_logs_held
from gnq_core.sources.tokenizer_panics import TokenizerFailure, guard_backend, panics_as_one_line


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
    return guard_backend(tokenizer, str(folder))  # every encode and decode inside the panic guard


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


@contextlib.contextmanager
def _as_checkpoint_error(folder: Path) -> Iterator[None]:
    """Any failure inside becomes one CheckpointError line naming the folder, and nothing else:
    transformers' log lines made meanwhile are shown only when nothing failed."""
    try:
        with library_logs_held():
            yield
    except (CheckpointError, TokenizerFailure):
        raise
    except limits.LimitError as exc:
        raise CheckpointError(str(exc)) from exc
    except Exception as exc:
        raise _error(folder, f"cannot load the checkpoint ({type(exc).__name__}: {_reason(exc)})") from exc
