"""The first batch's plan reused across an audit's checkpoints: only where provably valid, and the
numbers unchanged (float64, against the explicit per-example reference)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TOL, rel_err
from lm_fixtures import lm_batch, texts, tiny_gpt2, tiny_llama
from torch import nn

import gnq_core.engine.passes.first_batch as first_batch
from gnq_core import exact_gnq, per_example_lm_loss
from gnq_core.engine.plan.plan_reuse import PlanCache
from gnq_core.pipelines.audit import audit_batches
from gnq_core.sources.tokens import LMBatch

LAM = 1e-2
CPU = torch.device("cpu")


@pytest.fixture
def probes(monkeypatch):
    """How many times the probe ran."""
    count = [0]
    probe = first_batch.probe

    def counted(*args, **kwargs):
        count[0] += 1
        return probe(*args, **kwargs)

    monkeypatch.setattr(first_batch, "probe", counted)
    return count


def batches(seed: int = 2) -> list[LMBatch]:
    out = []
    for k, sizes in enumerate(([9, 5, 7, 3], [6, 8, 4])):
        b = lm_batch(sizes, seed=seed + k)
        out.append(LMBatch(list(range(10 * k, 10 * k + len(sizes))), b["input_ids"], b["attention_mask"],
                           b["labels"]))
    return out


def checkpoint(build, step: int) -> nn.Module:
    """The same model ``step`` steps on: a fresh instance, every weight moved."""
    torch.manual_seed(0)
    model = build()
    gen = torch.Generator().manual_seed(100 + step)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * step * torch.randn(p.shape, generator=gen))
    return model


def gnq_of(columns) -> pd.Series:
    return pd.concat(columns.frames(0)).set_index("example_id")["gnq"].sort_index()


def lm_losses(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return per_example_lm_loss(logits, batch["labels"])


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_reused_plan_gives_the_same_gnq_as_planning_anew_and_as_the_reference(build, probes):
    plans, data = PlanCache(), batches()
    for step in range(3):
        reused = gnq_of(audit_batches(checkpoint(build, step), data, LAM, CPU, plans=plans)[0])
        anew = gnq_of(audit_batches(checkpoint(build, step), data, LAM, CPU)[0])
        assert np.array_equal(reused.to_numpy(), anew.to_numpy())  # to the bit
        model = checkpoint(build, step)
        for batch in data:
            as_dict = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                       "labels": batch.labels}
            expected = exact_gnq(model, lm_losses, as_dict, LAM).gnq
            assert rel_err(torch.tensor(reused.loc[batch.example_ids].to_numpy()), expected) <= TOL
    assert (plans.probes, plans.reused) == (1, 2)
    assert probes[0] == 1 + 3  # the shared cache's one probe, and one per checkpoint without it


def test_a_different_structure_batch_or_path_is_planned_anew(probes):
    plans, data = PlanCache(), batches()
    audit_batches(checkpoint(tiny_gpt2, 0), data, LAM, CPU, plans=plans)
    audit_batches(checkpoint(tiny_gpt2, 1), data, LAM, CPU, plans=plans)
    assert (probes[0], plans.reused) == (1, 1)
    # another config (one layer more)
    audit_batches(checkpoint(lambda: tiny_gpt2(layers=3), 1), data, LAM, CPU, plans=plans)
    assert (probes[0], plans.reused) == (2, 1)
    # the same config, some parameters frozen (an audit over the trainable ones only)
    frozen = checkpoint(lambda: tiny_gpt2(layers=3), 2)
    frozen.transformer.h[0].requires_grad_(False)
    audit_batches(frozen, data, LAM, CPU, plans=plans, trainable_only=True)
    assert (probes[0], plans.reused) == (3, 1)
    # another first batch
    audit_batches(checkpoint(lambda: tiny_gpt2(layers=3), 2), batches(seed=7), LAM, CPU, plans=plans)
    audit_batches(checkpoint(lambda: tiny_gpt2(layers=3), 3), batches(seed=7), LAM, CPU, plans=plans)
    assert (probes[0], plans.reused) == (4, 2)
    # another checkpoint folder's name in the config alone: reused
    model = checkpoint(lambda: tiny_gpt2(layers=3), 4)
    model.config._name_or_path = "elsewhere/epoch-9"
    audit_batches(model, batches(seed=7), LAM, CPU, plans=plans)
    assert (probes[0], plans.reused) == (4, 3)


class Routed(nn.Module):
    """Which layer the batch goes through depends on a weight's sign (a router's choice)."""

    def __init__(self, sign: float):
        super().__init__()
        self.router = nn.Parameter(torch.tensor(sign))
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        inner = self.a if float(self.router.detach()) > 0 else self.b
        return self.head(torch.tanh(inner(x)) * self.router)


class Picked(nn.Module):
    """The same calls of the same shapes whatever the weights; which row of a table every example
    reads is the router's choice (an integer tensor's values)."""

    def __init__(self, sign: float):
        super().__init__()
        self.router = nn.Parameter(torch.tensor([sign, 0.0]))
        self.table = nn.Embedding(2, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        choice = self.router.detach().argmax().expand(x.shape[0])
        return self.head(torch.tanh(self.table(choice) * x) * self.router.sum())


@pytest.mark.parametrize("build", [Routed, Picked])
def test_a_forward_that_takes_another_path_at_new_weights_is_planned_anew(build, probes):
    """The structure and the batch are the same; the router's weight changed sign, so the checking
    forward calls another module, or one with other token ids, and the plan is made again; the
    same path reuses it."""
    from gnq_core import GNQAuditor

    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    plans = PlanCache()
    for sign in (1.0, 2.0, -1.0):
        torch.manual_seed(1)
        model = build(sign)
        with GNQAuditor(model, lam=LAM) as auditor:
            auditor.reuse_plans(plans)
            out = model(x).squeeze(1) ** 2
            out.sum().backward()
            got = auditor.compute().gnq
        expected = exact_gnq(model, lambda m, b: m(b).squeeze(1) ** 2, x, LAM).gnq
        assert rel_err(got, expected) <= TOL
    assert (probes[0], plans.reused) == (2, 1)


@pytest.mark.parametrize("companions", [None, "all"])
def test_run_audit_plans_once_per_run_and_scores_as_planning_each_checkpoint(tmp_path, probes, monkeypatch,
                                                                             companions):
    """Three saved checkpoints of one series: one probe for the run, the stored scores identical
    (float64) to a run that plans every checkpoint anew; in batches or against companions."""
    import gnq_core.pipelines.audit as audit_module
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.datasets import load_texts
    from gnq_core.sources.models import build_model, train_tokenizer

    rows = list(texts(10))
    (tmp_path / "t.txt").write_text("\n".join(rows) + "\n")
    tok = train_tokenizer(rows, vocab_size=300)
    for step in range(3):
        model = build_model("tiny", vocab_size=len(tok), max_length=20, seed=step,
                            eos_token_id=tok.eos_token_id)
        save_checkpoint(model, tok, tmp_path / "run" / f"epoch-{step + 1}")
    data = load_texts(tmp_path / "t.txt")
    settings = AuditSettings(batch_size=4, max_length=20, device="cpu", dtype="float64",
                             companions=companions)
    store = Store(tmp_path / "gnq.duckdb")
    reused = audit_module.run_audit(store, tmp_path / "run", data, name="reused", settings=settings)
    assert probes[0] == 1

    class Never(PlanCache):
        def reuse(self, *args, **kwargs):
            return None

    monkeypatch.setattr(audit_module, "PlanCache", Never)
    anew = audit_module.run_audit(store, tmp_path / "run", data, name="anew", settings=settings)
    assert probes[0] == 1 + 3
    a, b = (store.scores(r.run_id).sort_values(["point", "example_id"]) for r in (reused, anew))
    assert len(a) == 3 * len(rows) and a["gnq"].notna().all()
    assert np.array_equal(a["gnq"].to_numpy(), b["gnq"].to_numpy())
    assert np.array_equal(a["self_influence"].to_numpy(), b["self_influence"].to_numpy())
