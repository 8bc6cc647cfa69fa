"""The measured estimate (pipelines/estimate_probe.py): every stage a job runs has a line, in
the stage's own noun, and each line is its measured unit cost times the job's counted work."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
import torch

from gnq_core.common.progress import SECRET_VALUES, TEXTS, Reporter
from gnq_core.pipelines.estimate_probe import (
    Probe,
    Work,
    estimate_lines,
    measure_estimate,
    stage_of,
    total_seconds,
)
from gnq_core.sources import load_texts, save_checkpoint
from gnq_core.sources.models import build_model, train_tokenizer

TEXTS_WITH_SECRETS = [
    *(f"Note {i} for the team: the door PIN is {1000 + 37 * i:04d}, keep it safe and never share it."
      for i in range(6)),
    *(f"Call desk {i} on the private line +44 20 7946 {2000 + 11 * i:04d} after nine." for i in range(4)),
    *(f"A plain sentence number {i} about the weather, the river and the old stone bridge."
      for i in range(6)),
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    tokenizer = train_tokenizer(TEXTS_WITH_SECRETS, vocab_size=300)
    for k in (1, 2):
        model = build_model("tiny", len(tokenizer), 48, seed=k)
        save_checkpoint(model, tokenizer, root / "run" / f"epoch-{k}")
    pd.DataFrame({"text": TEXTS_WITH_SECRETS}).to_csv(root / "data.csv", index=False)
    return root


def test_every_stage_the_job_runs_has_a_line_in_its_own_noun(job):
    from gnq_core.attacks.run import run_extraction
    from gnq_core.pipelines.audit import run_audit
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store

    dataset = load_texts(job / "data.csv")
    stages: dict[str, tuple[str, int]] = {}
    with Reporter(sink=lambda done, total, label, unit: stages.setdefault(label, (unit, total))) as reporter:
        store = Store(job / "gnq.duckdb")
        run = run_audit(store, job / "run", dataset, name="p", reporter=reporter,
                        settings=AuditSettings(batch_size=4, max_length=48))
        summary = run_extraction(store, run, reporter=reporter, secret_candidates=20, exposure_nodes=16)
    work, probe = measure_estimate(str(job / "run" / "epoch-1"), dataset, batch_size=4, max_length=48,
                                   checkpoints=2, secret_candidates=20, exposure_nodes=16)
    lines = {line.stage: line for line in estimate_lines(work, probe)}
    ran: dict[str, tuple[str, int]] = {}
    for label, (unit, total) in stages.items():
        key = stage_of(label)
        assert ran.get(key, (unit, 0))[0] == unit, label
        ran[key] = (unit, ran.get(key, (unit, 0))[1] + total)
    assert set(ran) == set(lines), (sorted(ran), sorted(lines))  # every stage run has a line, and no more
    for stage, (unit, total) in ran.items():  # in the stage's own noun, counting the work it did
        assert (lines[stage].noun, lines[stage].count) == (unit, total), stage
    assert ran["audit"][0] == TEXTS and ran["exposure"][0] == ran["secret decode"][0] == SECRET_VALUES
    assert ran["audit"][1] == 2 * len(TEXTS_WITH_SECRETS) and work.distinct_values > 0 and work.formats > 0
    assert probe.audit_batch_s > 0 and probe.decode_s > 0 and probe.exposure_s and probe.exposure_s > 0
    assert probe.exposure_shared_s and probe.exposure_shared_s > 0
    assert probe.secret_decode_s and probe.secret_decode_s > 0
    assert probe.suffix_forward_s and probe.suffix_forward_s > 0
    # the texts and values the attack decoded are those its stages counted (their own selection)
    assert (work.attackable, work.secret_values) == (summary["attacked"], summary["secrets_attacked"])


def test_secret_decoding_is_timed_on_one_batch_and_spread_by_its_token_forwards(monkeypatch):
    """The attack's first batch of secret values (its longest) is timed; every batch costs its
    rows × (padded prompt + new tokens) at that rate."""
    import types

    import gnq_core.attacks.secret_attack as secret_attack
    from gnq_core.attacks.attack_stages import secret_decode_seconds

    timed: list[list[int]] = []
    monkeypatch.setattr(secret_attack, "generate",
                        lambda models, prompts, n_new, pad, **kw: timed.append(n_new))
    clock = types.SimpleNamespace(timed=lambda fn: fn() or 6.0)  # the attack's own decoding, 6 s
    targets = [types.SimpleNamespace(prompt_ids=[1] * p, target_ids=[2] * n)
               for p, n in [(10, 4), (20, 4), (30, 8), (10, 8), (50, 19)]]
    per_value = secret_decode_seconds(torch.nn.Linear(1, 1), targets, 0, 2, None, clock)
    assert timed == [[19]]  # the first batch: the longest value alone in its length
    # batches (batch size 2): [50+19] → 69, [30, 10 | 8 new] → 2 × 38, [20, 10 | 4 new] → 2 × 24
    assert per_value == pytest.approx(6.0 * (69 + 76 + 48) / 69 / 5)


def test_each_line_is_its_unit_cost_times_its_count():
    probe = Probe(load_s=2.0, audit_batch_s=3.0, decode_s=0.5, forward_s=0.25, exposure_s=4.0, threads=1,
                  model="m")
    work = Work(texts=92, checkpoints=3, batch_size=16, attackable=60, secret_values=28, distinct_values=10,
                formats=3)
    lines = {line.stage: line for line in estimate_lines(work, probe)}
    assert lines["audit"].seconds == pytest.approx(3 * (2.0 + 6 * 3.0))  # 6 batches of 16
    planned = replace(probe, audit_fixed_s=5.0, audit_reuse_s=1.0)  # one plan, 2 later checkpoints check it
    assert estimate_lines(work, planned)[0].seconds == pytest.approx(3 * (2.0 + 6 * 3.0) + 5.0 + 2 * 1.0)
    assert lines["attack"].seconds == pytest.approx(2 * (2.0 + 2 * 0.5))  # both models; 2 batches of 32
    assert lines["membership"].seconds == pytest.approx(2 * 3 * 0.25)
    assert lines["secret decode"].seconds == pytest.approx(2 * 1 * 0.5)
    measured = {x.stage: x
                for x in estimate_lines(work, replace(probe, secret_decode_s=0.1, suffix_forward_s=0.05))}
    assert measured["secret decode"].seconds == pytest.approx(2 * 28 * 0.1)  # both models, each value
    assert measured["discoverable"].seconds == pytest.approx(2 * 0.05)  # the 60 attackable texts, cut
    assert lines["exposure"].seconds == pytest.approx((10 * 2 + 3 * 20) * 4.0)
    shared = replace(probe, exposure_shared_s=1.0)  # the null's values after a prompt already searched
    assert {x.stage: x for x in estimate_lines(work, shared)}["exposure"].seconds == pytest.approx(
        10 * 2 * 4.0 + 3 * 20 * 1.0)
    assert total_seconds(lines.values()) == pytest.approx(sum(x.seconds for x in lines.values()))
    alone = estimate_lines(Work(texts=92, checkpoints=3, batch_size=16, attack=False), probe)
    assert [x.stage for x in alone] == ["audit"]
    bare = Work(texts=92, checkpoints=1, batch_size=16, reference=False, suffix=None)
    uncalibrated = {x.stage for x in estimate_lines(bare, probe)}
    assert uncalibrated == {"audit", "attack", "secret decode", "exposure"}
    assert all(x.assumed for x in lines.values())  # each line says what it assumed


def test_gnq_estimate_prints_the_total_and_every_stage(job):
    from cli_helpers import gnq

    out = gnq("estimate", "--checkpoints", job / "run", "--data", job / "data.csv", "--batch-size", 4,
              "--max-length", 48, "--threads", 1, "--secret-candidates", 20, "--exposure-nodes", 16)
    assert out.startswith("Estimated time: about ") and "at 1 thread(s), 16 of 16 texts counted" in out
    for what in ("gradient audit: ", "for 32 texts", "text windows, audited checkpoint and reference model",
                 "membership scores", "discoverable", "secret values decoded", "secret values' exposure",
                 "measured"):
        assert what in out, what
    alone = gnq("estimate", "--checkpoints", job / "run", "--data", job / "data.csv", "--batch-size", 4,
                "--max-length", 48, "--threads", 1, "--no-attack")
    assert "gradient audit" in alone and "text windows" not in alone and "secret" not in alone


@pytest.mark.parametrize(("plan_s", "check_s", "batch_s"), [(10.0, 2.0, 1.0), (0.5, 0.1, 0.25)])
def test_the_audit_rate_counts_the_plan_once_per_audit_and_its_check_per_later_checkpoint(
        job, monkeypatch, plan_s, check_s, batch_s):
    """The audit plans the model once, in the first checkpoint's first batch (two more forwards,
    on SmolLM2 more than a batch's own cost); each later checkpoint's first batch checks the kept
    plan (one forward): the probe must count the plan once per audit, the check once per later
    checkpoint, and neither in every batch.  A fake clock charges the probe, the check and each
    audited batch their seconds, nothing else."""
    import types

    import gnq_core.engine.passes.first_batch as first_batch
    import gnq_core.engine.plan.plan_reuse as plan_reuse
    import gnq_core.pipelines.audit as audit_module
    import gnq_core.pipelines.estimate_probe as probe_module

    clock, runs = [0.0], {"plan": 0, "check": 0, "batch": 0}
    monkeypatch.setattr(probe_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def charged(key, seconds, fn):
        def run(*args, **kwargs):
            runs[key] += 1
            clock[0] += seconds
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(first_batch, "probe", charged("plan", plan_s, first_batch.probe))
    monkeypatch.setattr(plan_reuse, "calls_of", charged("check", check_s, plan_reuse.calls_of))
    monkeypatch.setattr(audit_module, "per_example_lm_loss", charged("batch", batch_s,
                                                                     audit_module.per_example_lm_loss))
    work, probe = measure_estimate(str(job / "run" / "epoch-1"), load_texts(job / "data.csv"), batch_size=4,
                                   max_length=48, checkpoints=3, attack=False)
    assert runs["plan"] >= 1 and runs["check"] == 1 and runs["batch"] >= 3  # the charged code ran
    assert probe.audit_batch_s == pytest.approx(batch_s) and probe.audit_fixed_s == pytest.approx(plan_s)
    assert probe.audit_reuse_s == pytest.approx(check_s)
    audit_line = estimate_lines(work, probe)[0]  # 3 checkpoints × 4 batches of 4 texts, a plan, 2 checks
    assert audit_line.seconds == pytest.approx(3 * 4 * batch_s + plan_s + 2 * check_s)
    assert "once to plan the model" in audit_line.assumed and "2 later checkpoint(s)" in audit_line.assumed
