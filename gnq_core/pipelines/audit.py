"""Post-hoc audits: GNQ of every example at every checkpoint of a series.

The batch partition is seeded and the same for every checkpoint, so an example's GNQ is
measured against the same companions each time and GNQ is comparable along the trajectory
(DESIGN.md §4).  Each checkpoint's results are written in one transaction; a rerun skips the
checkpoints already done.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.losses import per_example_lm_loss
from gnq_core.engine.solve import GNQNumericalError
from gnq_core.pipelines.ranks import Ranks
from gnq_core.progress import Reporter
from gnq_core.results.store import Run, Store, StoreError
from gnq_core.runtime import code_version, resolve_device, resolve_dtype
from gnq_core.sources.checkpoints import (
    CheckpointRef,
    check_checkpoint,
    checkpoint_hash,
    find_checkpoints,
    load_checkpoint,
    load_tokenizer,
    tokenizer_fingerprint,
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


def audit_batches(model: torch.nn.Module, batches: list[LMBatch], lam: float, device: torch.device,
                  reporter: Reporter | None = None, indices: Sequence[int] | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GNQ, loss and self-influence of every example of ``batches`` at the model's current weights.

    Returns (scores, batches) frames in the store's layout; ``indices``: the batches' numbers in
    the audit's partition (default 0, 1, ...).  A batch whose loss or kernel is not finite is
    recorded with ``finite = False`` and NULL scores instead of stopping the audit.
    """
    score_rows, batch_rows = [], []
    indices = range(len(batches)) if indices is None else indices
    model.eval()  # the gradient at a checkpoint, without dropout noise
    for p in model.parameters():
        p.requires_grad_(True)
    with GNQAuditor(model, lam=lam) as auditor:
        for index, batch in zip(indices, batches, strict=True):
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


class _Tokenised:
    """The audit's texts as token ids and batches, once per distinct tokenizer of the series."""

    def __init__(self, dataset: TextDataset, partition: list[list[int]], max_length: int) -> None:
        self.dataset, self.partition, self.max_length = dataset, partition, max_length
        self._ids: dict[str, list[list[int]]] = {}
        self._batches: dict[str, list[LMBatch]] = {}

    def ids(self, tokenizer, checkpoint: str | Path) -> list[list[int]]:
        key = tokenizer_fingerprint(checkpoint)
        if key not in self._ids:
            self._ids[key] = encode_texts(tokenizer, self.dataset.texts, self.max_length)
        return self._ids[key]

    def batches(self, tokenizer, checkpoint: str | Path) -> list[LMBatch]:
        key = tokenizer_fingerprint(checkpoint) + f"/pad={pad_id(tokenizer)}"
        if key not in self._batches:
            ids, pad = self.ids(tokenizer, checkpoint), pad_id(tokenizer)
            self._batches[key] = [collate([ids[i] for i in part], part, pad) for part in self.partition]
        return self._batches[key]


def run_audit(store: Store | None, checkpoints: str | Path, dataset: TextDataset, *, name: str,
              settings: AuditSettings = AuditSettings(), reporter: Reporter | None = None,
              ranks: Ranks | None = None) -> Run | None:
    """Audit every checkpoint under ``checkpoints`` into run ``name``; resumes an unfinished run.

    Under torchrun every rank calls this with its ``Ranks``: the lead (rank 0) alone opens the
    store (the others pass ``store=None`` and get None back), each rank audits every N-th batch
    of each checkpoint, and the lead writes the gathered rows — the rows one process writes.
    The next checkpoint is loaded in a thread while the current one is audited.
    """
    reporter = reporter or Reporter()
    ranks = ranks or Ranks()
    refs = find_checkpoints(checkpoints)
    device = ranks.device(resolve_device(settings.device))
    dtype = resolve_dtype(settings.dtype)
    tokens = _Tokenised(dataset, batch_partition(len(dataset), settings.batch_size, settings.seed),
                        settings.max_length)
    run = None
    if ranks.lead:
        assert store is not None, "the lead rank writes the rows: it needs the store"
        try:
            run, todo = _prepare(store, refs, dataset, name, settings, device, tokens, reporter)
        except Exception as exc:
            ranks.broadcast(exc)  # the other ranks stop with the same one-line error
            raise
        ranks.broadcast(todo)
    else:
        todo = ranks.broadcast(None)

    def load(point: int) -> tuple[torch.nn.Module, Any, str | None]:
        path = refs[point].path
        model, tokenizer = load_checkpoint(path, device=device, dtype=dtype)
        return model, tokenizer, checkpoint_hash(path) if ranks.lead else None

    tracking = store.tracking(run.run_id) if run is not None else contextlib.nullcontext()
    with tracking, ThreadPoolExecutor(max_workers=1) as loader:
        upcoming = loader.submit(load, todo[0]) if todo else None
        for n, point in enumerate(todo):
            t0 = time.perf_counter()
            model, tokenizer, model_hash = upcoming.result()
            upcoming = loader.submit(load, todo[n + 1]) if n + 1 < len(todo) else None
            ref = refs[point]
            rows = _audit_share(model, tokens.batches(tokenizer, ref.path), ref, settings, device, reporter,
                                ranks)
            del model
            if run is not None:
                store.write_point(run.run_id, point, *rows, time.perf_counter() - t0, path=str(ref.path),
                                  model_hash=model_hash)
    return store.run(run.run_id) if run is not None else None


def _prepare(store: Store, refs: list[CheckpointRef], dataset: TextDataset, name: str,
             settings: AuditSettings, device: torch.device, tokens: _Tokenised,
             reporter: Reporter) -> tuple[Run, list[int]]:
    """The run (created or resumed) and the checkpoints still to audit, after every check."""
    run = store.find_run(name)
    finished: set[int] = set()
    if run is not None:
        _check_same_audit(store, run, dataset, settings, refs)
        finished = set(store.points(run.run_id).query("status == 'done'")["point"])
    for i, ref in enumerate(refs):  # a broken checkpoint still to audit is refused before anything is written
        if i not in finished:
            check_checkpoint(ref.path, settings.max_length)
    if run is None:
        run = _create_audit_run(store, refs, dataset, name, settings, device, tokens)
    else:
        store.set_status(run.run_id, "running")
    store.add_points(run.run_id, [dict(point=i, label=r.label, kind="checkpoint", path=str(r.path))
                                  for i, r in enumerate(refs)])
    done = set(store.points(run.run_id).query("status == 'done'")["point"])
    for i, ref in enumerate(refs):
        if i in done:
            reporter.log(f"{ref.label}: already audited, skipped")
    return run, [i for i in range(len(refs)) if i not in done]


def _audit_share(model: torch.nn.Module, batches: list[LMBatch], ref: CheckpointRef, settings: AuditSettings,
                 device: torch.device, reporter: Reporter, ranks: Ranks) -> tuple[pd.DataFrame, pd.DataFrame]:
    """This rank's batches of one checkpoint; on the lead, every rank's rows in batch order."""
    mine = ranks.share(len(batches))
    reporter.stage(f"{ref.label}", sum(len(batches[k].example_ids) for k in mine))
    rows = audit_batches(model, [batches[k] for k in mine], settings.lam, device, reporter, indices=mine)
    parts = ranks.gather(rows)
    if not ranks.lead:
        return rows
    scores = pd.concat([p[0] for p in parts]).sort_values("batch_index", kind="stable")
    frame = pd.concat([p[1] for p in parts]).sort_values("batch_index", kind="stable")
    return scores.reset_index(drop=True), frame.reset_index(drop=True)


def _create_audit_run(store: Store, refs: list[CheckpointRef], dataset: TextDataset, name: str,
                      settings: AuditSettings, device: torch.device, tokens: _Tokenised) -> Run:
    n_tokens = [len(x) for x in tokens.ids(load_tokenizer(refs[0].path), refs[0].path)]
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
