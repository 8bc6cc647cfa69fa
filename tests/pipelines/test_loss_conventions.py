"""The loss convention (token mean / token sum) and the λ mode (absolute / relative to the
batch's mean K_jj): exact against explicit per-example gradients in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TOL, kernel_err, rel_err
from lm_fixtures import lm_batch, tiny_gpt2

from gnq_core import GNQAuditor, exact_gnq, per_example_lm_loss
from gnq_core.engine.math.losses import batch_mean_weights, lm_target_counts
from gnq_core.engine.math.reference import loo_gnq
from gnq_core.engine.math.solve import effective_lam
from gnq_core.pipelines.settings import AuditSettings

LENGTHS = [14, 9, 5, 12, 3, 14]


def losses_of(convention):
    def fn(model, batch):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return per_example_lm_loss(out.logits, batch["labels"], convention)
    return fn


def audited(model, batch, lam, convention="token_mean", lam_mode="absolute", weights=None):
    with GNQAuditor(model, lam=lam, lam_mode=lam_mode) as auditor:
        losses = losses_of(convention)(model, batch)
        (losses.sum() if weights is None else (weights * losses).sum()).backward()
        return auditor.compute(weights=weights)


def test_token_sum_is_n_times_the_mean():
    torch.manual_seed(0)
    model = tiny_gpt2().eval()
    batch = lm_batch(LENGTHS, seed=1)
    mean = losses_of("token_mean")(model, batch)
    total = losses_of("token_sum")(model, batch)
    n = lm_target_counts(batch["labels"]).to(total.dtype)
    assert torch.allclose(total, mean * n, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="loss convention"):
        losses_of("token_max")(model, batch)


def test_token_sum_gnq_matches_float64_reference():
    torch.manual_seed(3)
    model = tiny_gpt2().eval()
    batch = lm_batch(LENGTHS, seed=2)
    res = audited(model, batch, 1e-2, "token_sum")
    ref = exact_gnq(model, losses_of("token_sum"), batch, 1e-2)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    # the sum's gradients are n_j × the mean's: K_sum = D K_mean D, so GNQ differs (same λ)
    mean = exact_gnq(model, losses_of("token_mean"), batch, 1e-2)
    n = lm_target_counts(batch["labels"]).to(torch.float64)
    assert kernel_err(ref.kernel, mean.kernel * n[:, None] * n[None, :]) <= TOL
    assert rel_err(res.gnq, mean.gnq) > 1e-3


def test_training_objective_weights_for_token_sums_undo_the_batch_mean():
    """The trainer steps on the batch mean of token means; with token-sum GNQ the weights
    1/(B n_j) must give back the token-sum kernel exactly."""
    torch.manual_seed(4)
    model = tiny_gpt2().eval()
    batch = lm_batch(LENGTHS, seed=3)
    w = batch_mean_weights(batch["labels"], "token_sum")
    res = audited(model, batch, 1e-2, "token_sum", weights=w)
    ref = exact_gnq(model, losses_of("token_sum"), batch, 1e-2)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    mean = losses_of("token_mean")(model, batch).mean()
    total = (losses_of("token_sum")(model, batch) * w).sum()
    assert torch.allclose(mean, total, rtol=1e-12)


@pytest.mark.parametrize("convention", ["token_mean", "token_sum"])
def test_relative_lambda_matches_reference_and_is_scale_free(convention):
    torch.manual_seed(5)
    model = tiny_gpt2().eval()
    batch = lm_batch(LENGTHS, seed=4)
    c = 0.05
    res = audited(model, batch, c, convention, lam_mode="relative")
    ref = exact_gnq(model, losses_of(convention), batch, 1.0)
    lam_eff = c * float(ref.kernel.diagonal().mean())
    assert res.lam == pytest.approx(lam_eff, rel=1e-10)
    assert rel_err(res.gnq, loo_gnq(ref.gradients, lam_eff)) <= TOL
    # scaling every gradient by 7 (the loss by 7) leaves relative-λ GNQ unchanged, absolute-λ GNQ not
    scaled = audited(model, batch, c, convention, lam_mode="relative", weights=torch.full((6,), 7.0,
                                                                                         dtype=torch.float64))
    assert rel_err(scaled.gnq, res.gnq) <= TOL
    g7 = 7 * ref.gradients
    assert rel_err(loo_gnq(g7, c * float((g7 * g7).sum(1).mean())), res.gnq) <= TOL
    assert rel_err(loo_gnq(g7, lam_eff), res.gnq) > 1e-2


def test_effective_lambda_rules():
    K = torch.diag(torch.tensor([2.0, 4.0], dtype=torch.float64))
    assert effective_lam(K, 0.1) == 0.1
    assert effective_lam(K, 0.1, "relative") == pytest.approx(0.3)
    assert effective_lam(torch.zeros(2, 2, dtype=torch.float64), 0.1, "relative") == 0.1
    with pytest.raises(ValueError, match="λ mode"):
        effective_lam(K, 0.1, "scaled")
    with pytest.raises(ValueError, match="loss convention"):
        AuditSettings(loss="mean")
    with pytest.raises(ValueError, match="λ mode"):
        AuditSettings(lam_mode="rel")
    with pytest.raises(ValueError, match="λ mode"):
        GNQAuditor(torch.nn.Linear(2, 2), lam=1.0, lam_mode="rel")


def test_training_and_audit_record_the_convention_and_train_the_same_model(tmp_path):
    """token_sum changes what GNQ measures, never the update: both runs save the same weights;
    the stored loss is n_targets × the mean; the run rows record loss and λ mode."""
    from lm_fixtures import texts

    from gnq_core.pipelines.audit import run_audit
    from gnq_core.pipelines.settings import TrainSettings
    from gnq_core.pipelines.train import run_training
    from gnq_core.results.store import Store
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.datasets import load_texts

    path = tmp_path / "t.txt"
    path.write_text("\n".join(texts(12)) + "\n")
    data = load_texts(path)
    store = Store(tmp_path / "gnq.duckdb")
    runs, models = {}, {}
    for loss in ("token_mean", "token_sum"):
        s = TrainSettings(epochs=1, batch_size=4, max_length=20, vocab_size=300, lr=1e-3, device="cpu",
                          loss=loss, lam_mode="relative")
        runs[loss] = run_training(store, data, tmp_path / loss, name=loss, settings=s)
        models[loss], _ = load_checkpoint(tmp_path / loss / "epoch-1")
    for (name, a), b in zip(models["token_mean"].named_parameters(), models["token_sum"].parameters(),
                            strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name
    mean = store.scores(runs["token_mean"].run_id).set_index("example_id")["loss"].sort_index()
    total = store.scores(runs["token_sum"].run_id).set_index("example_id")["loss"].sort_index()
    n = store.examples(runs["token_sum"].run_id).set_index("example_id")["n_tokens"].sort_index() - 1
    assert np.allclose(total, mean * n, rtol=1e-5)
    assert store.run("token_sum").settings["loss"] == "token_sum"
    assert store.run("token_sum").settings["lam_mode"] == "relative"
    with store.connect(read_only=True) as con:
        words = dict(con.execute("SELECT name, loss_convention FROM runs").fetchall())
    assert words["token_sum"].startswith("per-example summed")
    assert words["token_mean"].startswith("per-example mean")
    audit = run_audit(store, tmp_path / "token_sum" / "epoch-1", data, name="audit-sum",
                      settings=AuditSettings(batch_size=4, max_length=20, device="cpu", loss="token_sum",
                                             lam_mode="relative", lam=0.05))
    assert store.run(audit.name).settings["loss"] == "token_sum"
    assert store.run(audit.name).settings["lam_mode"] == "relative"


def test_cli_audit_takes_the_loss_and_lambda_mode_and_refuses_unknown_ones(tmp_path):
    """`gnq audit --loss token_sum --lam-mode relative` records both; an unknown value is one line,
    exit 1, and no run is created."""
    from lm_fixtures import texts
    from typer.testing import CliRunner

    from gnq_core.cli import app
    from gnq_core.results.store import Store
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import build_model, train_tokenizer

    rows = list(texts(8))
    data = tmp_path / "t.txt"
    data.write_text("\n".join(rows) + "\n")
    tok = train_tokenizer(rows, vocab_size=300)
    save_checkpoint(build_model("tiny", vocab_size=len(tok), max_length=20, seed=0,
                                eos_token_id=tok.eos_token_id), tok, tmp_path / "ck")
    db = tmp_path / "gnq.duckdb"
    base = ["audit", "--checkpoints", str(tmp_path / "ck"), "--data", str(data), "--db", str(db),
            "--batch-size", "4", "--max-length", "20", "--quiet"]
    bad = CliRunner().invoke(app, [*base, "--name", "bad", "--loss", "token_max"])
    assert bad.exit_code == 1 and "token_max" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert Store(db).find_run("bad") is None if db.exists() else True
    ok = CliRunner().invoke(app, [*base, "--name", "sum", "--loss", "token_sum", "--lam-mode", "relative"])
    assert ok.exit_code == 0, ok.output
    settings = Store(db).run("sum").settings
    assert (settings["loss"], settings["lam_mode"]) == ("token_sum", "relative")
