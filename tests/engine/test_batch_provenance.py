"""The batch is followed by provenance, not guessed from shapes: sequence length equal to the
batch size (T5's [T, T] relative-position ids then look batch-first) stays exact."""

from __future__ import annotations

import pytest
import torch
from conftest import TOL, kernel_err
from families import batch, build, losses

from gnq_core import GNQAuditor
from gnq_core.engine.math.reference import per_example_gradients


@pytest.mark.parametrize("family, task", [("t5", "seq2seq"), ("opt", "causal"), ("mixtral", "causal")])
def test_sequence_length_equal_to_batch_size_is_exact(family, task):
    model = build(family, task)
    inputs = batch(task)
    inputs = {k: v[:, :3] for k, v in inputs.items()}  # B = T = 3
    G = per_example_gradients(losses(model, task, inputs), list(model.parameters()))
    with GNQAuditor(model, lam=1e-2) as auditor:
        losses(model, task, inputs).sum().backward()
        res = auditor.compute()
    assert kernel_err(res.kernel, G @ G.T) <= TOL
    kernels = {e.module: e.kernel for e in res.coverage.entries}
    if family == "t5":  # the bias lookup (and the [T] position ids, ambiguous at T = B) are
        # covered on a module enclosing the code that computes their ids, never as batch-first
        assert not any("relative_attention_bias" in m for m in kernels)
        assert "enclosing-vjp" in kernels.values()
    torch.testing.assert_close(res.kernel, res.kernel.T)
