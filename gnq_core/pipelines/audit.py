"""Post-hoc audits: GNQ of every example at every checkpoint of a series.

The batch partition is seeded and the same for every checkpoint, so an example's GNQ is
measured against the same companions each time and GNQ is comparable along the trajectory
(DESIGN.md §4).  Each checkpoint's results are written in one transaction; a rerun skips the
checkpoints already done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from gnq_core.engine.auditor import GNQAuditor, check_lam
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
from gnq_core.sources.tokens import LMBatch, batch_partition, collate, encode_texts, pad_id


@dataclass(frozen=True)
class AuditSettings:
    lam: float = 1e-2
    batch_size: int = 16
    max_length: int = 128
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:  # refused before a run is created: no failed run left behind
        check_lam(self.lam)


def audit_batches(model: torch.nn.Module, batches: list[LMBatch], lam: float, device: torch.device,
                  reporter: Reporter | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GNQ, loss and self-influence of every example of ``batches`` at the model's current weights.

    Returns (scores, batches) frames in the store's layout.  A batch whose loss or kernel is not
    finite is recorded with ``finite = False`` and NULL scores instead of stopping the audit.
    """
    score_rows, batch_rows = [], []
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
            loss_values = losses.detach().double().tolist()
            for i, example_id in enumerate(batch.example_ids):
                score_rows.append((example_id, index, None, gnq[i] if gnq else None, loss_values[i],
                                   kjj[i] if kjj else None))
            batch_rows.append((index, None, len(batch.example_ids), condition, finite,
                               time.perf_counter() - t0))
            if reporter is not None:
                reporter.advance(len(batch.example_ids))
    scores = pd.DataFrame(score_rows, columns=["example_id", "batch_index", "step", "gnq", "loss",
                                               "self_influence"]).astype({"step": "Int64"})
    frame = pd.DataFrame(batch_rows, columns=["batch_index", "step", "size", "condition", "finite",
                                              "seconds"]).astype({"step": "Int64"})
    return scores, frame


def make_batches(tokenizer, dataset: TextDataset, partition: list[list[int]],
                 max_length: int) -> list[LMBatch]:
    ids = encode_texts(tokenizer, dataset.texts, max_length)
    pad = pad_id(tokenizer)
    return [collate([ids[i] for i in part], part, pad) for part in partition]


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
    partition = batch_partition(len(dataset), settings.batch_size, settings.seed)
    with store.tracking(run.run_id):
        for i, ref in enumerate(refs):
            if i in done:
                reporter.log(f"{ref.label}: already audited, skipped")
                continue
            _audit_one(store, run, i, ref, dataset, partition, settings, device, dtype, reporter)
    return store.run(run.run_id)


def _audit_one(store: Store, run: Run, point: int, ref: CheckpointRef, dataset: TextDataset,
               partition: list[list[int]], settings: AuditSettings, device: torch.device,
               dtype: torch.dtype, reporter: Reporter) -> None:
    t0 = time.perf_counter()
    model, tokenizer = load_checkpoint(ref.path, device=device, dtype=dtype)
    batches = make_batches(tokenizer, dataset, partition, settings.max_length)
    reporter.stage(f"{ref.label}", len(dataset))
    scores, frame = audit_batches(model, batches, settings.lam, device, reporter)
    store.write_point(run.run_id, point, scores, frame, time.perf_counter() - t0,
                      path=str(ref.path), model_hash=checkpoint_hash(ref.path))
    del model


def _create_audit_run(store: Store, refs: list[CheckpointRef], dataset: TextDataset, name: str,
                      settings: AuditSettings, device: torch.device) -> Run:
    _, tokenizer = load_checkpoint(refs[0].path, device="cpu")
    n_tokens = [len(x) for x in encode_texts(tokenizer, dataset.texts, settings.max_length)]
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
