"""Plain PyTorch layers (Opacus's per-sample-gradient list and more), float64, against explicit
per-example gradients: every layer exact, in batch-first and sequence-first layouts, through
parametrizations, with a batch size of 4 and one equal to the sequence length (5); layers with
dropout exact in train mode against per-example gradients of the same forward (the same masks);
BatchNorm in train mode refused with its reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL, kernel_err, rel_err
from torch import nn
from torch.nn.utils import parametrizations

from gnq_core import GNQAuditor, UnsupportedModuleError, exact_gnq
from gnq_core.engine.math.reference import per_example_gradients

B, T, D = 4, 5, 6


class Head(nn.Module):
    """body(x) -> per-example logits over 3 classes (mean over everything but the batch)."""

    def __init__(self, body: nn.Module, width: int, seq_first: bool = False, pick=None):
        super().__init__()
        self.body, self.out, self.seq_first, self.pick = body, nn.Linear(width, 3), seq_first, pick

    def forward(self, x):
        if self.seq_first:
            x = x.transpose(0, 1)
        y = self.body(x)
        if self.pick is not None:
            y = self.pick(y)
        if self.seq_first:
            y = y.transpose(0, 1)
        y = y.reshape(y.shape[0], -1, y.shape[-1]) if y.dim() > 2 else y
        return self.out(y.mean(1) if y.dim() == 3 else y)


class SharedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(D, D), nn.Linear(D, D)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class RawParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(D))

    def forward(self, x):
        return x * self.scale


def first(y):
    return y[0]


def channels(shape):
    return lambda b: torch.randn(b, *shape)


LAYERS = {
    "Conv3d": (lambda: Head(nn.Conv3d(2, 4, 2), 4, pick=lambda y: y.flatten(2).transpose(1, 2)),
               channels((2, 3, 3, 3))),
    "ConvTranspose2d": (lambda: Head(nn.ConvTranspose2d(2, 4, 2, stride=2), 4,
                                     pick=lambda y: y.flatten(2).transpose(1, 2)), channels((2, 3, 3))),
    "GroupNorm": (lambda: Head(nn.GroupNorm(2, 4), 4, pick=lambda y: y.flatten(2).transpose(1, 2)),
                  channels((4, 5))),
    "InstanceNorm1d": (lambda: Head(nn.InstanceNorm1d(4, affine=True), 4,
                                    pick=lambda y: y.transpose(1, 2)), channels((4, 5))),
    "BatchNorm1d (eval)": (lambda: Head(nn.BatchNorm1d(D), D).eval(), channels((D,))),
    "PReLU": (lambda: Head(nn.PReLU(D), D), channels((D,))),
    "RMSNorm": (lambda: Head(nn.RMSNorm(D), D), channels((T, D))),
    "EmbeddingBag": (lambda: Head(nn.EmbeddingBag(20, D, mode="mean"), D),
                     lambda b: torch.randint(0, 20, (b, T))),
    "shared weight": (lambda: Head(SharedWeight(), D), channels((T, D))),
    "raw Parameter": (lambda: Head(RawParameter(), D), channels((T, D))),
    "MultiheadAttention batch-first": (
        lambda: Head(SelfAttention(nn.MultiheadAttention(D, 2, batch_first=True)), D), channels((T, D))),
    "MultiheadAttention seq-first": (
        lambda: Head(SelfAttention(nn.MultiheadAttention(D, 2)), D, seq_first=True), channels((T, D))),
    "TransformerEncoderLayer batch-first": (
        lambda: Head(nn.TransformerEncoderLayer(D, 2, 8, dropout=0.0, batch_first=True), D),
        channels((T, D))),
    "TransformerEncoderLayer seq-first": (
        lambda: Head(nn.TransformerEncoderLayer(D, 2, 8, dropout=0.0), D, seq_first=True), channels((T, D))),
    **{f"{rnn.__name__} {layout}": (
        (lambda rnn=rnn, layout=layout: Head(rnn(D, 5, batch_first=layout == "batch-first"), 5,
                                             seq_first=layout == "seq-first", pick=first)),
        channels((T, D))) for rnn in (nn.RNN, nn.GRU, nn.LSTM) for layout in ("batch-first", "seq-first")},
    "weight_norm": (lambda: Head(parametrizations.weight_norm(nn.Linear(D, D)), D), channels((T, D))),
    "spectral_norm (eval)": (lambda: Head(parametrizations.spectral_norm(nn.Linear(D, D)), D).eval(),
                             channels((T, D))),
}


class SelfAttention(nn.Module):
    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def ce_losses(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


@pytest.mark.parametrize("batch_size", [B, T], ids=["B=4", "B=T"])
@pytest.mark.parametrize("path", ["unfused", "fused", "posthoc"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_is_exact(layer, path, batch_size):
    torch.manual_seed(0)
    build, inputs = LAYERS[layer]
    model = build()
    batch = (inputs(batch_size), torch.randint(0, 3, (batch_size,)))
    with GNQAuditor(model, lam=1e-2, fused=path == "fused") as auditor:
        objective = ce_losses(model, batch).sum()
        auditor.backward(objective) if path == "posthoc" else objective.backward()
        res = auditor.compute()
    ref = exact_gnq(model, ce_losses, batch, 1e-2)
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    assert rel_err(res.gnq, ref.gnq) <= TOL


def test_batchnorm_in_train_mode_is_refused_with_its_reason():
    model = Head(nn.BatchNorm1d(D), D).train()
    with GNQAuditor(model, lam=1e-2), pytest.raises(UnsupportedModuleError, match="couples the examples"):
        ce_losses(model, (torch.randn(B, D), torch.randint(0, 3, (B,)))).sum().backward()


class DropoutMix(nn.Module):
    """A module with its own parameters and dropout inside (covered by the generic kernel)."""

    def __init__(self):
        super().__init__()
        self.w, self.g = nn.Parameter(torch.randn(D, D) / D**0.5), nn.Parameter(torch.ones(D))

    def forward(self, x):
        return F.dropout(torch.tanh(x @ self.w), 0.3, self.training) * self.g


DROPOUT_LAYERS = {
    "TransformerEncoderLayer batch-first": lambda: Head(
        nn.TransformerEncoderLayer(D, 2, 8, dropout=0.2, batch_first=True), D),
    "TransformerEncoderLayer seq-first": lambda: Head(
        nn.TransformerEncoderLayer(D, 2, 8, dropout=0.2), D, seq_first=True),
    "MultiheadAttention seq-first": lambda: Head(SelfAttention(nn.MultiheadAttention(D, 2, dropout=0.2)), D,
                                                 seq_first=True),
    "custom module with dropout": lambda: Head(DropoutMix(), D),
}


@pytest.mark.parametrize("batch_size", [B, T], ids=["B=4", "B=T"])
@pytest.mark.parametrize("path", ["unfused", "fused", "posthoc"])
@pytest.mark.parametrize("layer", list(DROPOUT_LAYERS))
def test_dropout_in_train_mode_is_exact(layer, path, batch_size):
    """The re-run draws the batch's own dropout masks: the reference is one forward from the same
    seed, differentiated per example."""
    torch.manual_seed(0)
    model = DROPOUT_LAYERS[layer]().train()
    batch = (torch.randn(batch_size, T, D), torch.randint(0, 3, (batch_size,)))
    torch.manual_seed(1)
    G = per_example_gradients(ce_losses(model, batch), list(model.parameters()))
    with GNQAuditor(model, lam=1e-2, fused=path == "fused") as auditor:
        torch.manual_seed(1)
        objective = ce_losses(model, batch).sum()
        auditor.backward(objective) if path == "posthoc" else objective.backward()
        res = auditor.compute()
    assert kernel_err(res.kernel, G @ G.T) <= TOL
    torch.manual_seed(2)  # other masks give another kernel: the comparison can tell masks apart
    G2 = per_example_gradients(ce_losses(model, batch), list(model.parameters()))
    assert kernel_err(G2 @ G2.T, G @ G.T) > 1e-3
