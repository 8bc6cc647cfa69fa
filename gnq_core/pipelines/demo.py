"""The demo: a tiny GPT-2 trained from scratch on data/demo.csv with in-run GNQ, a post-hoc audit
of its epoch checkpoints, and the calibrated extraction attack on both (``gnq extract``'s rule:
12-token prefix, exactly 8 more tokens, the first checkpoint as reference), so the dashboard has
real results on first start (under a minute on 2 CPU cores).  data/demo.csv holds common facts,
surprising false claims, unique texts with a secret in them (a PIN, a card number, an e-mail
address, a phone number) and fictional customer records repeated four times each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.extraction import run_extraction
from gnq_core.pipelines.settings import AuditSettings, TrainSettings
from gnq_core.pipelines.train import run_training
from gnq_core.progress import Reporter
from gnq_core.results.layout import demo_checkpoints
from gnq_core.results.store import Store
from gnq_core.sources.datasets import load_texts

DEMO_DATA = Path(__file__).resolve().parents[2] / "data" / "demo.csv"
TRAIN_RUN, AUDIT_RUN = "demo-training", "demo-audit"


def build_demo(store: Store, *, out_dir: Path | None = None, epochs: int = 12, device: str = "auto",
               data: Path = DEMO_DATA,
               reporter_factory: Callable[[Callable[[], int | None]], Reporter] | None = None) -> list[str]:
    """Train, audit and attack; every step resumes, so an interrupted demo continues on rerun."""
    dataset = load_texts(data)
    out_dir = Path(out_dir) if out_dir is not None else demo_checkpoints(store.path)

    def reporter(name: str) -> Reporter:
        if reporter_factory is None:
            return Reporter()
        return reporter_factory(lambda: getattr(store.find_run(name), "run_id", None))

    train = TrainSettings(epochs=epochs, batch_size=16, lr=3e-3, lam=1e-2, max_length=64, seed=0,
                          preset="tiny", vocab_size=1024, device=device)
    with reporter(TRAIN_RUN) as r:
        trained = run_training(store, dataset, out_dir, name=TRAIN_RUN, settings=train, reporter=r)
    audit = AuditSettings(lam=1e-2, batch_size=16, max_length=64, seed=0, device=device)
    with reporter(AUDIT_RUN) as r:
        audited = run_audit(store, out_dir, dataset, name=AUDIT_RUN, settings=audit, reporter=r)
    for run in (audited, trained):
        if not store.extractions(run.run_id).empty:
            continue  # already attacked: a rerun of the demo is instant
        with reporter(run.name) as r:
            run_extraction(store, run, batch_size=64, device=device, reporter=r)  # gnq extract's rule
    return [AUDIT_RUN, TRAIN_RUN]
