"""The demo: a tiny GPT-2 trained from scratch on data/demo.csv with in-run GNQ, a post-hoc audit
of its epoch checkpoints, and the calibrated extraction attack on both (``gnq extract``'s rule:
12-token prefix, exactly 8 more tokens, the first checkpoint as reference), so the dashboard has
real results on first start (under a minute on 2 CPU cores).  data/demo.csv holds common facts,
surprising false claims, unique texts with a secret in them (a PIN, a card number, an e-mail
address, a phone number) and fictional customer records repeated four times each.

``model="smollm2"``: fine-tune the real pretrained SmolLM2-135M-Instruct (``gnq model fetch``)
instead of pretraining the tiny model (runs ``demo-smollm2-training``/``-audit``; the attack's
reference is the base model).  On one CPU thread that takes roughly 15 minutes an epoch (measured:
18 s for one audited batch of 16 texts × 48 tokens on a shared 2-core machine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from gnq_core.pipelines.settings import (
    AuditJob,
    AuditSettings,
    DemoJob,
    ExtractJob,
    JobSettings,
    TrainJob,
    TrainSettings,
)
from gnq_core.results.layout import demo_checkpoints
from gnq_core.results.store import Store

DEMO_DATA = Path(__file__).resolve().parents[2] / "data" / "demo.csv"
TRAIN_RUN, AUDIT_RUN = "demo-training", "demo-audit"


def demo_runs(job: DemoJob) -> tuple[str, str]:
    """The demo's (training, audit) run names."""
    if job.model is None:
        return TRAIN_RUN, AUDIT_RUN
    return f"demo-{job.model}-training", f"demo-{job.model}-audit"


def demo_steps(job: DemoJob, store: Store) -> Iterator[JobSettings]:
    """The demo as the jobs ``run_job`` runs one after the other: train, audit, and the attack on
    each run not attacked yet (a rerun of a built demo is instant; every step resumes)."""
    data = job.data or str(DEMO_DATA)
    init, default_dir = None, demo_checkpoints(store.path)
    train_run, audit_run = demo_runs(job)
    if job.model is not None:
        from gnq_core.sources.real_models import fetch_model

        init = str(fetch_model(job.model))
        default_dir = default_dir.with_name(f"demo-{job.model}-checkpoints")
    out = job.out or str(default_dir)
    # A pretrained model is fine-tuned (a small learning rate); the tiny one is trained from scratch.
    train = TrainSettings(epochs=job.epochs, batch_size=16, lr=3e-3 if init is None else 1e-4, lam=1e-2,
                          max_length=64, seed=0, preset="tiny", vocab_size=1024, device=job.device)
    yield TrainJob(data=data, out=out, name=train_run, init=init, settings=train)
    audit = AuditSettings(lam=1e-2, batch_size=16, max_length=64, seed=0, device=job.device)
    yield AuditJob(data=data, checkpoints=out, name=audit_run, settings=audit)
    for name in (audit_run, train_run):
        if store.extractions(store.run(name).run_id).empty:
            # gnq extract's rule; a fine-tune's reference is its base model
            yield ExtractJob(run=name, batch_size=64, device=job.device,
                             **({} if init is None else {"reference": init}))
