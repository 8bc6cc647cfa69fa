"""Post-hoc audits: GNQ of every example at every checkpoint of a series.

The batch partition is seeded and the same for every checkpoint, so an example's GNQ is
measured against the same companions each time and GNQ is comparable along the trajectory
(DESIGN.md §4); copies of a text go to different batches whenever the data allow it, since
copies in one batch explain each other's gradient (sources/copies.py).  Each checkpoint's
results are written in one transaction; a rerun skips the checkpoints already done.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import torch

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.losses import per_example_lm_loss
from gnq_core.pipelines.scoring import score_batch, scores_of
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.pipelines.text_labels import ensure_text_labels, text_labels
from gnq_core.progress import Reporter
from gnq_core.results.records import BatchResult, RunSpec, TextResult
from gnq_core.results.store import Run, Store
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

COPIES_APART = "seeded shuffle, copies in different batches"  # settings["partition"] of new audits


def audit_batches(model: torch.nn.Module, batches: list[LMBatch], lam: float, device: torch.device,
                  reporter: Reporter | None = None) -> tuple[list[TextResult], list[BatchResult]]:
    """GNQ, loss and self-influence of every example of ``batches`` at the model's current weights."""
    texts, results = [], []
    model.eval()  # the gradient at a checkpoint, without dropout noise
    for p in model.parameters():
        p.requires_grad_(True)
    with GNQAuditor(model, lam=lam) as auditor:
        for index, batch in enumerate(batches):
            t0 = time.perf_counter()
            b = batch.to(device)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            losses = per_example_lm_loss(logits, b.labels)
            auditor.backward(losses.sum())  # output gradients only: no weight-gradient matmuls
            rows, result = score_batch(lambda: scores_of(auditor.compute()), losses, batch.example_ids,
                                       batch_index=index, step=None, started=t0)
            model.zero_grad(set_to_none=True)
            texts += rows
            results.append(result)
            if reporter is not None:
                reporter.advance(len(batch.example_ids))
    return texts, results


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
    spec = _run_spec(refs, dataset, name, settings, device)
    run = store.resumable_run(spec)
    finished = set() if run is None else set(store.points(run.run_id).query("status == 'done'")["point"])
    for i, ref in enumerate(refs):  # a broken checkpoint still to audit is refused before anything is written
        if i not in finished:
            check_checkpoint(ref.path, settings.max_length)
    loaded = None  # the first checkpoint, loaded once: its tokenizer also counts the run's tokens
    if run is None:
        loaded = load_checkpoint(refs[0].path, device=device, dtype=dtype)
        n_tokens = [len(x) for x in encode_texts(loaded[1], dataset.texts, settings.max_length)]
        examples = pd.DataFrame({"example_id": range(len(dataset)), "text": dataset.texts,
                                 "grp": dataset.groups, "n_tokens": n_tokens})
        run = store.create_run(spec, pd.concat([examples, text_labels(dataset.texts)], axis=1))
    else:
        store.set_status(run.run_id, "running")
    store.add_points(run.run_id, [dict(point=i, label=r.label, kind="checkpoint", path=str(r.path))
                                  for i, r in enumerate(refs)])
    done = set(store.points(run.run_id).query("status == 'done'")["point"])
    examples = ensure_text_labels(store, run)
    # Copies in one batch explain each other (GNQ ≈ 1): keep them apart.  A run audited before
    # this rule keeps its plain partition, so all its checkpoints share one partition.
    clusters = examples["cluster_id"].tolist() if run.settings.get("partition") == COPIES_APART else None
    partition = batch_partition(len(dataset), settings.batch_size, settings.seed, clusters)
    with store.tracking(run.run_id):
        for i, ref in enumerate(refs):
            if i in done:
                reporter.log(f"{ref.label}: already audited, skipped")
                continue
            t0 = time.perf_counter()
            model, tokenizer = loaded or load_checkpoint(ref.path, device=device, dtype=dtype)
            loaded = None
            batches = make_batches(tokenizer, dataset, partition, settings.max_length)
            reporter.stage(f"{ref.label}", len(dataset))
            texts, results = audit_batches(model, batches, settings.lam, device, reporter)
            store.write_point(run.run_id, i, texts, results, time.perf_counter() - t0, path=str(ref.path),
                              model_hash=checkpoint_hash(ref.path))
            del model
    return store.run(run.run_id)


def _run_spec(refs: list[CheckpointRef], dataset: TextDataset, name: str, settings: AuditSettings,
              device: torch.device) -> RunSpec:
    """The run's description; a rerun must match it (more checkpoints after the stored ones are
    fine: a series that grew as training went on)."""
    return RunSpec(
        name=name, kind="audit", lam=settings.lam, batch_size=settings.batch_size, seed=settings.seed,
        max_length=settings.max_length, model_path=str(Path(refs[0].path).parent if len(refs) > 1
                                                       else refs[0].path),
        dataset_path=str(dataset.path), dataset_hash=dataset.sha256, n_examples=len(dataset),
        code_version=code_version(), device=str(device), dtype=settings.dtype,
        settings={"checkpoints": [r.label for r in refs], "text_column": dataset.text_column,
                  "group_column": dataset.group_column, "partition": COPIES_APART})
