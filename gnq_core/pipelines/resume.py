"""The one training resume: the optimizer and RNG state saved beside each epoch's checkpoint, and a
training continued from that folder exactly where it left off (``run_training`` and the studies'
pretraining alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gnq_core.common.atomic import atomic_path
from gnq_core.results.store_schema import StoreError
from gnq_core.sources.checkpoints.load import load_checkpoint

TRAINER_STATE = "trainer_state.pt"


def save_trainer_state(path: Path, optimizer: torch.optim.Optimizer, epochs_done: int, step: int) -> None:
    """Optimizer and RNG state beside the weights, so a rerun continues exactly where this left off."""
    with atomic_path(path / TRAINER_STATE) as tmp:
        torch.save({"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                    "epochs_done": epochs_done, "step": step}, tmp)


def resume_from(path: Path, device: torch.device | str = "cpu",
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict[str, Any], torch.Tensor]:
    """The model, tokenizer, optimizer state and RNG state a training saved in ``path``."""
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise StoreError(f"{path}: cannot resume, {TRAINER_STATE} is missing; start a new run with "
                         "another --name")
    model, tokenizer = load_checkpoint(path, device=device)
    state = torch.load(state_file, map_location="cpu", weights_only=True)  # never unpickle code
    return model, tokenizer, state["optimizer"], state["rng"]
