"""A checkpoint's tokenizer (or the one a folder given instead holds), checked against its config
and guarded so a Rust tokenizer panic is one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gnq_core.sources import limits
from gnq_core.sources.checkpoints.config import config_vocab_size, load_config
from gnq_core.sources.checkpoints.errors import as_checkpoint_error, folder_error, reason
from gnq_core.sources.checkpoints.files import TOKENIZER_FILES, checkpoint_dir
from gnq_core.sources.tokenizer_panics import TokenizerFailure, guard_backend, panics_as_one_line

TOKENIZER_HINT = ("; give a folder that has them with --tokenizer DIR (the base model's, say), or save them "
                  "with each checkpoint: Trainer(..., processing_class=tokenizer)")


def read_tokenizer(folder: Path, config: Any, source: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of ``folder``, or of ``source`` when given (checkpoints saved without one)."""
    if source is not None:
        folder = Path(source)
        if not folder.is_dir():
            raise folder_error(folder, "the tokenizer folder given does not exist")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise folder_error(folder, f"no tokenizer files (none of {', '.join(TOKENIZER_FILES)})"
                                   + ("" if source is not None else TOKENIZER_HINT))
    limits.check_tokenizer_size(folder, config_vocab_size(config))
    try:
        with panics_as_one_line(str(folder), "the tokenizer failed while loading"):
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except TokenizerFailure:
        raise
    except Exception as exc:
        raise folder_error(folder, f"cannot load the tokenizer ({reason(exc)})") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise folder_error(folder, f"the tokenizer is a {type(tokenizer).__name__}, not a text tokenizer")
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return guard_backend(tokenizer, str(folder))  # every encode and decode inside the panic guard


def load_tokenizer(path: str | Path, tokenizer: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer alone (no weights read), as load_checkpoint returns it."""
    folder = checkpoint_dir(path)
    with as_checkpoint_error(folder):
        return read_tokenizer(folder, load_config(folder), tokenizer)
