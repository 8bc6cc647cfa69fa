"""The forward-only signals the studies set beside GNQ: per text at a model's current weights,
its loss, Min-K% and Min-K%++ (the columns an audit stores, without a gradient).  Used to score
the models a study trains on halves or subsets, where an audit of every model would cost a
gradient pass each."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from gnq_core.attacks.forward import forward_batches
from gnq_core.attacks.membership import token_signals
from gnq_core.engine.math.losses import per_example_lm_loss


def forward_signals(model: torch.nn.Module, token_ids: Sequence[Sequence[int]], pad: int,
                    batch_size: int = 32, device: torch.device | None = None) -> pd.DataFrame:
    """Per text at the model's current weights, forward only: ``loss`` (mean next-token NLL),
    ``min_k``, ``min_k_plus`` (``token_signals``) — the columns an audit stores, without GNQ."""
    rows: dict[str, list[float]] = {"loss": [], "min_k": [], "min_k_plus": []}
    for _, b, logits in forward_batches(model, token_ids, pad, batch_size, device):
        rows["loss"] += per_example_lm_loss(logits, b.labels).double().cpu().tolist()
        for name, values in token_signals(logits, b.labels).items():
            rows[name].extend(values.tolist())
    return pd.DataFrame(rows)
