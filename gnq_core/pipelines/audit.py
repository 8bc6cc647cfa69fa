"""Post-hoc audits: GNQ of every example at every checkpoint of a series.

The batch partition is seeded and the same for every checkpoint, so an example's GNQ is
measured against the same companions each time and GNQ is comparable along the trajectory
(DESIGN.md §4).  Each checkpoint's results are written in one transaction; a rerun skips the
checkpoints already done.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.losses import per_example_lm_loss
from gnq_core.engine.solve import GNQNumericalError
from gnq_core.progress import Reporter
from gnq_core.results.store import Run, Store, StoreError
from gnq_core.runtime import code_version, resolve_device, resolve_dtype
from gnq_core.sources.checkpoints import (
    CheckpointRef,
    check_checkpoint,
    checkpoint_hash,
    find_checkpoints,
    load_checkpoint,
)
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.tokens import LMBatch, partition_order, stream_batches, token_counts


@dataclass(frozen=True)
class AuditSettings:
    lam: float = 1e-2
    batch_size: int = 16
    max_length: int = 128
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"


def audit_batches(model: torch.nn.Module, batches: Iterable[LMBatch], lam: float, device: torch.device,
                  reporter: Reporter | None = None, n_examples: int | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GNQ, loss and self-influence of every example of ``batches`` at the model's current weights.

    Returns (scores, batches) frames in the store's layout.  A batch whose loss or kernel is not
    finite is recorded with ``finite = False`` and NULL scores instead of stopping the audit.
    Batches are consumed one at a time; with ``n_examples`` the scores go straight into numpy
    columns (about 40 bytes per example) instead of a Python tuple per example.
    """
    scores = _ScoreColumns(n_examples)
    batch_rows = []
    model.eval()  # the gradient at a checkpoint, without dropout noise
    for p in model.parameters():
        p.requires_grad_(True)
    with GNQAuditor(model, lam=lam) as auditor:
        for index, batch in enumerate(batches):
            t0 = time.perf_counter()
            b = batch.to(device)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            losses = per_example_lm_loss(logits, b.labels)
            finite = bool(torch.isfinite(losses).all())
            gnq = kjj = condition = None
            auditor.backward(losses.sum())  # output gradients only: no weight-gradient matmuls
            try:
                res = auditor.compute()  # raises on a non-finite kernel (e.g. from a NaN loss)
                if finite:
                    gnq, kjj, condition = res.gnq.tolist(), res.self_influence.tolist(), res.condition
            except GNQNumericalError:
                finite = False
            model.zero_grad(set_to_none=True)
            scores.add(batch.example_ids, index, gnq, losses.detach().double().tolist(), kjj)
            batch_rows.append((index, None, len(batch.example_ids), condition, finite,
                               time.perf_counter() - t0))
            if reporter is not None:
                reporter.advance(len(batch.example_ids))
    frame = pd.DataFrame(batch_rows, columns=["batch_index", "step", "size", "condition", "finite",
                                              "seconds"]).astype({"step": "Int64"})
    return scores.frame(), frame


class _ScoreColumns:
    """One point's scores as numpy columns, filled batch by batch; GNQ and self-influence are NULL
    (masked) for a batch that was not finite, as the store wants."""

    def __init__(self, n: int | None) -> None:
        self.n = 0
        size = n or 1024
        self.ids = np.empty(size, np.int64)
        self.batch = np.empty(size, np.int32)
        self.values = np.empty((size, 3), np.float64)  # gnq, loss, self_influence
        self.known = np.empty(size, bool)  # False: GNQ and self-influence are NULL

    def add(self, example_ids: list[int], index: int, gnq: list[float] | None, loss: list[float],
            kjj: list[float] | None) -> None:
        k = len(example_ids)
        if self.n + k > len(self.ids):  # no size given: grow geometrically
            grow = max(2 * len(self.ids), self.n + k)
            self.ids, self.batch = np.resize(self.ids, grow), np.resize(self.batch, grow)
            self.values, self.known = np.resize(self.values, (grow, 3)), np.resize(self.known, grow)
        rows = slice(self.n, self.n + k)
        self.ids[rows], self.batch[rows] = example_ids, index
        self.values[rows, 0] = gnq if gnq else 0.0
        self.values[rows, 1] = loss
        self.values[rows, 2] = kjj if kjj else 0.0
        self.known[rows] = bool(gnq)
        self.n += k

    def frame(self) -> pd.DataFrame:
        n, unknown = self.n, ~self.known[:self.n]
        return pd.DataFrame({
            "example_id": self.ids[:n], "batch_index": self.batch[:n],
            "step": pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool)),
            "gnq": pd.arrays.FloatingArray(self.values[:n, 0].copy(), unknown.copy()),
            "loss": self.values[:n, 1], "self_influence": pd.arrays.FloatingArray(self.values[:n, 2].copy(),
                                                                                  unknown.copy())})


def run_audit(store: Store, checkpoints: str | Path, dataset: TextDataset, *, name: str,
              settings: AuditSettings = AuditSettings(), reporter: Reporter | None = None) -> Run:
    """Audit every checkpoint under ``checkpoints`` into run ``name``; resumes an unfinished run."""
    reporter = reporter or Reporter()
    refs = find_checkpoints(checkpoints)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype)
    run = store.find_run(name)
    finished: set[int] = set()
    if run is not None:
        _check_same_audit(store, run, dataset, settings, refs)
        finished = set(store.points(run.run_id).query("status == 'done'")["point"])
    for i, ref in enumerate(refs):  # a broken checkpoint still to audit is refused before anything is written
        if i not in finished:
            check_checkpoint(ref.path, settings.max_length)
    if run is None:
        run = _create_audit_run(store, refs, dataset, name, settings, device)
    else:
        store.set_status(run.run_id, "running")
    store.add_points(run.run_id, [dict(point=i, label=r.label, kind="checkpoint", path=str(r.path))
                                  for i, r in enumerate(refs)])
    done = set(store.points(run.run_id).query("status == 'done'")["point"])
    order = partition_order(len(dataset), settings.seed)
    with store.tracking(run.run_id):
        for i, ref in enumerate(refs):
            if i in done:
                reporter.log(f"{ref.label}: already audited, skipped")
                continue
            _audit_one(store, run, i, ref, dataset, order, settings, device, dtype, reporter)
    return store.run(run.run_id)


def _audit_one(store: Store, run: Run, point: int, ref: CheckpointRef, dataset: TextDataset,
               order: np.ndarray, settings: AuditSettings, device: torch.device,
               dtype: torch.dtype, reporter: Reporter) -> None:
    t0 = time.perf_counter()
    model, tokenizer = load_checkpoint(ref.path, device=device, dtype=dtype)
    batches = stream_batches(tokenizer, dataset.texts, order, settings.batch_size, settings.max_length)
    reporter.stage(f"{ref.label}", len(dataset))
    scores, frame = audit_batches(model, batches, settings.lam, device, reporter, n_examples=len(dataset))
    store.write_point(run.run_id, point, scores, frame, time.perf_counter() - t0,
                      path=str(ref.path), model_hash=checkpoint_hash(ref.path))
    del model


def _create_audit_run(store: Store, refs: list[CheckpointRef], dataset: TextDataset, name: str,
                      settings: AuditSettings, device: torch.device) -> Run:
    _, tokenizer = load_checkpoint(refs[0].path, device="cpu")
    n_tokens = token_counts(tokenizer, dataset.texts, settings.max_length)
    examples = pd.DataFrame({"example_id": range(len(dataset)), "text": dataset.texts,
                             "grp": dataset.groups, "n_tokens": n_tokens})
    return store.create_run(
        name=name, kind="audit", lam=settings.lam, batch_size=settings.batch_size, seed=settings.seed,
        max_length=settings.max_length, model_path=str(Path(refs[0].path).parent if len(refs) > 1
                                                       else refs[0].path),
        dataset_path=str(dataset.path), dataset_hash=dataset.sha256, n_examples=len(dataset),
        code_version=code_version(), device=str(device), dtype=settings.dtype,
        settings={"checkpoints": [r.label for r in refs], "text_column": dataset.text_column,
                  "group_column": dataset.group_column},
        examples=examples)


def _check_same_audit(store: Store, run: Run, dataset: TextDataset, settings: AuditSettings,
                      refs: list[CheckpointRef]) -> None:
    """Resuming is only meaningful with the same data, settings and checkpoints (more checkpoints
    after the stored ones are fine: a series that grew as training went on)."""
    mismatches = []
    if run.kind != "audit":
        raise StoreError(f"{store.path}: run {run.name!r} is a {run.kind} run, not an audit; "
                         "pick another --name")
    if run.dataset_hash != dataset.sha256:
        mismatches.append("dataset content")
    for field in ("lam", "batch_size", "seed", "max_length"):
        if getattr(run, field) != getattr(settings, field):
            mismatches.append(f"{field} ({getattr(run, field)} stored, {getattr(settings, field)} given)")
    stored = [str(label) for label in run.settings.get("checkpoints", [])]
    given = [r.label for r in refs]
    if given[:len(stored)] != stored:
        mismatches.append(f"checkpoint series ({', '.join(stored)} stored, {', '.join(given)} given)")
    if mismatches:
        raise StoreError(f"{store.path}: run {run.name!r} exists with a different {', '.join(mismatches)}; "
                         "use another --name to start a new audit")
