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

from collections.abc import Callable
from pathlib import Path

from gnq_core.pipelines.attacks.run import run_extraction
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings, TrainSettings
from gnq_core.pipelines.train import run_training
from gnq_core.progress import Reporter
from gnq_core.results.layout import demo_checkpoints
from gnq_core.results.store import Store
from gnq_core.sources.datasets import load_texts

DEMO_DATA = Path(__file__).resolve().parents[2] / "data" / "demo.csv"
TRAIN_RUN, AUDIT_RUN = "demo-training", "demo-audit"
REAL_MODELS = ("smollm2",)


def build_demo(store: Store, *, out_dir: Path | None = None, epochs: int = 12, device: str = "auto",
               data: Path = DEMO_DATA, model: str | None = None,
               reporter_factory: Callable[[Callable[[], int | None]], Reporter] | None = None) -> list[str]:
    """Train, audit and attack; every step resumes, so an interrupted demo continues on rerun."""
    dataset = load_texts(data)
    init = None
    train_run, audit_run, default_dir = TRAIN_RUN, AUDIT_RUN, demo_checkpoints(store.path)
    if model is not None:
        if model not in REAL_MODELS:
            raise ValueError(f"unknown demo model {model!r} (known: {', '.join(REAL_MODELS)})")
        from gnq_core.sources.real_models import fetch_model

        init = fetch_model(model)
        train_run, audit_run = f"demo-{model}-training", f"demo-{model}-audit"
        default_dir = default_dir.with_name(f"demo-{model}-checkpoints")
    out_dir = Path(out_dir) if out_dir is not None else default_dir

    def reporter(name: str) -> Reporter:
        if reporter_factory is None:
            return Reporter()
        return reporter_factory(lambda: getattr(store.find_run(name), "run_id", None))

    # A pretrained model is fine-tuned (a small learning rate); the tiny one is trained from scratch.
    train = TrainSettings(epochs=epochs, batch_size=16, lr=3e-3 if init is None else 1e-4, lam=1e-2,
                          max_length=64, seed=0, preset="tiny", vocab_size=1024, device=device)
    with reporter(train_run) as r:
        trained = run_training(store, dataset, out_dir, name=train_run, init=init, settings=train, reporter=r)
    audit = AuditSettings(lam=1e-2, batch_size=16, max_length=64, seed=0, device=device)
    with reporter(audit_run) as r:
        audited = run_audit(store, out_dir, dataset, name=audit_run, settings=audit, reporter=r)
    for run in (audited, trained):
        if not store.extractions(run.run_id).empty:
            continue  # already attacked: a rerun of the demo is instant
        with reporter(run.name) as r:
            # gnq extract's rule; a fine-tune's reference is its base model
            extra = {} if init is None else {"reference": str(init)}
            run_extraction(store, run, batch_size=64, device=device, reporter=r, **extra)
    return [audit_run, train_run]
