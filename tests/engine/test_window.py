"""GNQ over an accumulation window (engine/passes/window.py): exact mode equals one batch of the same
texts; micro-batches of 1; a window of < 2 texts gets no GNQ; the exact window's memory budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.reference import exact_gnq
from gnq_core.engine.math.solve import GNQNumericalError
from gnq_core.engine.passes.window import WindowBudgetError
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.pipelines.scoring import score_batch, scores_of
from tests.conftest import TOL, kernel_err, rel_err
from tests.lm_fixtures import lm_batch, tiny_gpt2, tiny_llama

LAM = 1e-3


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


def run_window(auditor: GNQAuditor, model, batch, micro: int):
    """Accumulate over micro-batches of ``micro`` texts (mean over the window, as a Trainer's
    accumulation does), then finish the window."""
    B = batch["input_ids"].shape[0]
    for start in range(0, B, micro):
        part = {k: v[start:start + micro] for k, v in batch.items()}
        w = torch.full((part["input_ids"].shape[0],), 1.0 / B)
        (w * lm_losses(model, part)).sum().backward()
        auditor.add_micro_batch(w)
    return auditor.finish_window()


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama], ids=["gpt2-tied", "llama"])
@pytest.mark.parametrize("micro", [2, 1])
def test_window_equals_one_batch(build, micro):
    """MUST-SHOW: GNQ over a window of 4 micro-batches equals the exact GNQ of the same texts
    audited as one batch (reference: torch.func per-example gradients), float64, ≤ 1e-9."""
    torch.seed()  # fresh weights and texts each run
    model = build().double()
    batch = lm_batch([int(n) for n in torch.randint(3, 12, (4 * micro,))], seed=int(torch.randint(0, 99, ())))
    ref = exact_gnq(model, lm_losses, batch, LAM)
    with GNQAuditor(model, LAM, batch="step", mode="exact") as auditor:
        res = run_window(auditor, model, batch, micro)
    assert res.batch_size == 4 * micro and res.micro_batches == 4 and res.mode == "exact"
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    assert rel_err(res.gnq, ref.gnq) <= TOL


def test_window_is_not_the_micro_batches():
    """The window's GNQ differs from each micro-batch's own (companions beyond the micro-batch)."""
    torch.manual_seed(0)
    model = tiny_gpt2().double()
    batch = lm_batch([6, 8, 5, 9, 7, 4, 10, 6], seed=3)
    with GNQAuditor(model, LAM, batch="step", mode="exact") as auditor:
        micro = []
        for start in range(0, 8, 2):
            part = {k: v[start:start + 2] for k, v in batch.items()}
            lm_losses(model, part).sum().backward()
            micro.append(auditor.add_micro_batch().gnq)
        res = auditor.finish_window()
    per_micro = torch.cat(micro)
    assert (res.gnq < per_micro).all()  # more companions explain more of each gradient


def test_window_of_one_text_has_no_gnq():
    model = tiny_llama().double()
    batch = lm_batch([7], seed=1)
    with GNQAuditor(model, LAM, batch="step", mode="exact") as auditor:
        lm_losses(model, batch).sum().backward()
        auditor.add_micro_batch()
        res = auditor.finish_window()
    assert res.gnq is None and res.lam is None and res.batch_size == 1
    assert res.self_influence.shape == (1,)


def test_exact_window_budget():
    model = tiny_gpt2().double()
    batch = lm_batch([6, 8, 5, 9], seed=2)
    with (GNQAuditor(model, LAM, batch="step", mode="exact", window_budget=10_000),
          pytest.raises(WindowBudgetError, match="use mode='sketch'")):
        lm_losses(model, batch).sum().backward()


def test_auto_window_turns_to_sketch_past_its_budget():
    """auto: exact while the kept factors fit; past the budget the window is sketched (and says
    so), and with identity sketches that is still the exact K."""
    torch.manual_seed(1)
    model = tiny_gpt2().double()
    batch = lm_batch([6, 8, 5, 9, 7, 4], seed=2)
    ref = exact_gnq(model, lm_losses, batch, LAM)
    spec = SketchSpec(k=10**6, vocab_rows=10**6)
    with GNQAuditor(model, LAM, batch="step", mode="auto", sketch=spec) as auditor:
        small = run_window(auditor, model, {k: v[:2] for k, v in batch.items()}, 1)
        auditor.window_budget = 150_000  # fits one micro-batch of 2, not three
        res = run_window(auditor, model, batch, 2)
    assert small.mode == "exact" and res.mode == "sketch" and res.k == 10**6
    assert rel_err(res.gnq, ref.gnq) <= TOL


def test_sketch_window_records_its_settings():
    model = tiny_gpt2().double()
    batch = lm_batch([6, 8, 5, 9], seed=2)
    spec = SketchSpec(k=64, seed=7, vocab_rows=128)
    with GNQAuditor(model, LAM, batch="step", mode="sketch", sketch=spec) as auditor:
        res = run_window(auditor, model, batch, 1)
    assert (res.mode, res.k, res.seed, res.batch_size, res.micro_batches) == ("sketch", 64, 7, 4, 4)
    assert res.gnq is not None and torch.isfinite(res.gnq).all()


def test_sketch_window_holds_one_shared_vector_per_text():
    """The default sketch folds every parameter into one vector of ``total`` numbers per text:
    the window holds B_eff × total × 4 bytes for a float32 model, whatever its parameters, and
    the Gram of those vectors is the window's K."""
    model = tiny_llama().float()
    batch = lm_batch([6, 8, 5, 9, 7, 4], seed=3)
    with GNQAuditor(model, LAM, batch="step", mode="sketch") as auditor:
        for start in range(0, 6, 2):
            part = {k: v[start:start + 2] for k, v in batch.items()}
            lm_losses(model, part).sum().backward()
            auditor.add_micro_batch()
        assert auditor.held_bytes() == 6 * SketchSpec().total * 4
        S = auditor.window_sketches(auditor._window)
        res = auditor.finish_window()
    assert S.shape == (6, SketchSpec().total) and kernel_err(res.kernel, S @ S.T) <= TOL


def test_bad_mode():
    with pytest.raises(ValueError, match="window mode"):
        GNQAuditor(tiny_gpt2(), LAM, batch="step", mode="approximate")


def test_a_batch_of_one_text_is_scored_null_not_its_norm():
    """gnq train / gnq audit / the Trainer's micro-batch mode: a last batch of one text gets NULL
    GNQ (it has no companions), its loss and K_jj are kept."""
    model = tiny_llama().double()
    batch = lm_batch([7], seed=1)
    with GNQAuditor(model, LAM) as auditor:
        losses = lm_losses(model, batch)
        losses.sum().backward()
        res = auditor.compute()
    texts, row = score_batch(lambda: scores_of(res), losses, [5], targets=torch.tensor([6]), batch_index=0,
                             step=None, started=0.0)
    assert np.isnan(texts.column("gnq")[0]) and texts.column("self_influence")[0] > 0
    assert row.size == 1 and row.finite


@pytest.mark.parametrize("mode", ["exact", "sketch"])
def test_a_nan_micro_batch_fails_its_window_only(mode):
    model = tiny_gpt2().double()
    batch = lm_batch([6, 8, 5, 9], seed=2)
    with GNQAuditor(model, LAM, batch="step", mode=mode) as auditor:
        losses = lm_losses(model, {k: v[:2] for k, v in batch.items()})
        (losses * float("nan")).sum().backward()
        auditor.add_micro_batch()
        lm_losses(model, {k: v[2:] for k, v in batch.items()}).sum().backward()
        auditor.add_micro_batch()
        with pytest.raises(GNQNumericalError):
            auditor.finish_window()
        model.zero_grad()
        lm_losses(model, batch).sum().backward()
        auditor.add_micro_batch()
        res = auditor.finish_window()  # the next window is unaffected
    assert res.gnq is not None and torch.isfinite(res.gnq).all() and res.batch_size == 4
