"""No shape decides which dimension is the batch: a batch size equal to the sequence length, to
the hidden size or to the number of heads, in batch-first and sequence-first modules, is exact or
refused in one line, never silently wrong.  (Before the two-batch probe, a sequence-first module
with B = T was covered as if its first dim were the batch: 35% off in K for MultiheadAttention.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL, kernel_err
from torch import nn

from gnq_core import GNQAuditor
from gnq_core.engine.math.reference import per_example_gradients

T, D, H = 5, 6, 2  # sequence length, hidden size, heads


class SeqFirstMix(nn.Module):
    """A custom module on [T, B, d] that mixes time steps (each example's own)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin, self.g = nn.Linear(d, d), nn.Parameter(torch.randn(d))

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        return h * self.g + h.mean(0, keepdim=True)


class SelfAttention(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


class Model(nn.Module):
    """Batch-first [B, T, d] in and [B, 3] out; the body sees [T, B, d] when sequence-first."""

    def __init__(self, body: nn.Module, seq_first: bool):
        super().__init__()
        self.body, self.seq_first, self.out = body, seq_first, nn.Linear(D, 3)

    def forward(self, x):
        y = self.body(x.transpose(0, 1)).transpose(0, 1) if self.seq_first else self.body(x)
        return self.out(y.mean(1))


BODIES = {
    "MultiheadAttention": lambda seq_first: SelfAttention(
        nn.MultiheadAttention(D, H, batch_first=not seq_first)),
    "TransformerEncoderLayer": lambda seq_first: nn.TransformerEncoderLayer(
        D, H, 8, dropout=0.0, batch_first=not seq_first),
    "custom": lambda seq_first: SeqFirstMix(D),
    "GRU": lambda seq_first: _FirstOutput(nn.GRU(D, D, batch_first=not seq_first)),
}


class _FirstOutput(nn.Module):
    def __init__(self, rnn: nn.Module):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


def _losses(model, x, y):
    return F.cross_entropy(model(x), y, reduction="none")


# the custom module is sequence-first by construction: it has no batch-first case
LAYOUTS = [(body, layout) for body in BODIES for layout in ("batch-first", "seq-first")
           if not (body == "custom" and layout == "batch-first")]


@pytest.mark.parametrize("B", [T, D, H], ids=["B=T", "B=hidden", "B=heads"])
@pytest.mark.parametrize(("body", "layout"), LAYOUTS, ids=[f"{b}-{lay}" for b, lay in LAYOUTS])
def test_equal_sizes_are_exact_or_refused(body, layout, B):
    torch.manual_seed(B)
    model = Model(BODIES[body](layout == "seq-first"), seq_first=layout == "seq-first")
    x, y = torch.randn(B, T, D), torch.randint(0, 3, (B,))
    G = per_example_gradients(_losses(model, x, y), list(model.parameters()))
    with GNQAuditor(model, lam=1e-2) as auditor:  # all of these are exact (none refused)
        _losses(model, x, y).sum().backward()
        res = auditor.compute()
    assert kernel_err(res.kernel, G @ G.T) <= TOL
