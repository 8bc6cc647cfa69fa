"""Post-hoc audits: GNQ of every example at every checkpoint of a series.

The batch partition is seeded and the same for every checkpoint, so an example's GNQ is
measured against the same companions each time and GNQ is comparable along the trajectory
(DESIGN.md §4); copies of a text go to different batches whenever the data allow it, since
copies in one batch explain each other's gradient (sources/copies.py).  Each checkpoint's
results are written in one transaction; a rerun skips the checkpoints already done.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from gnq_core.attacks.membership import TOKEN_SIGNALS
from gnq_core.common.progress import Reporter
from gnq_core.common.runtime import code_version, resolve_device, resolve_dtype
from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.conventions import LAM_ABSOLUTE, TOKEN_MEAN
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.plan.plan_reuse import PlanCache
from gnq_core.pipelines.companion_plan import check_companion_memory, sketch_spec
from gnq_core.pipelines.companions import audit_companions, companion_sets
from gnq_core.pipelines.finite_share import check_mostly_finite
from gnq_core.pipelines.ranks import Ranks
from gnq_core.pipelines.scoring import score_pass
from gnq_core.pipelines.settings import COMPANIONS_ALL, DTYPE_AUTO, AuditSettings
from gnq_core.pipelines.sharding import check_shardable, device_mesh, local_numel, lockstep, shard
from gnq_core.results.layout import companions_root
from gnq_core.results.precision import audit_precision
from gnq_core.results.records import BatchResult, RunSpec, ScoreColumns
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.results.store_schema import TURNS_COLUMN
from gnq_core.results.text_labels import cluster_ids
from gnq_core.sources.adapters import Adapters, adapter_hash, check_adapter, load_adapter_checkpoint
from gnq_core.sources.chat import ChatDataset, chat_settings
from gnq_core.sources.checkpoints.checks import check_checkpoint
from gnq_core.sources.checkpoints.files import CheckpointRef, checkpoint_hash
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.checkpoints.series import check_one_series, find_checkpoints
from gnq_core.sources.checkpoints.tokenizer import load_tokenizer
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.memory_plan import (
    MemoryError_,
    MemoryPlan,
    check_plan,
    is_out_of_memory,
    model_shape,
    oom_message,
)
from gnq_core.sources.text_labels import dataset_labels, secret_settings
from gnq_core.sources.tokens import LMBatch, Partition, seeded_partition, stream_batches, token_counts

COPIES_APART = "seeded shuffle, copies in different batches"  # settings["partition"] of new audits


def audit_batches(model: torch.nn.Module, batches: Iterable[LMBatch], lam: float, device: torch.device,
                  reporter: Reporter | None = None, indices: Iterable[int] | None = None,
                  capacity: int = 1024, *, loss: str = TOKEN_MEAN, lam_mode: str = LAM_ABSOLUTE,
                  trainable_only: bool = False, plans: PlanCache | None = None, padding: int = 0
                  ) -> tuple[ScoreColumns, list[BatchResult]]:
    """GNQ, loss and self-influence of every example of ``batches`` at the model's current weights,
    and the forward signals Min-K% / Min-K%++ (``membership.token_signals``) from the same logits.

    ``batches`` are consumed one at a time (a generator tokenises each as it is needed) and the
    texts' results go into numpy columns (``capacity``: the number of texts expected).
    ``indices``: the batches' numbers in the audit's partition (default 0, 1, ...); ``loss``:
    the per-example loss convention; ``lam_mode``: λ absolute or relative to the batch's mean K_jj;
    ``trainable_only``: GNQ over the parameters that already require gradients (a PEFT adapter's),
    else over all of them; ``plans``: the first batch's plan of an earlier checkpoint of the same
    audit, reused where it provably holds (``engine.plan.plan_reuse``), and this one's kept there;
    ``padding``: the last ``padding`` of ``indices`` (a list then) run only to keep the ranks of a
    sharded model in lockstep (``sharding.lockstep``): their rows are dropped."""
    texts, results = ScoreColumns(capacity, TOKEN_SIGNALS), []
    kept = len(indices) - padding if padding else None  # type: ignore[arg-type]
    indices = itertools.count() if indices is None else indices
    model.eval()  # the gradient at a checkpoint, without dropout noise
    if not trainable_only:
        for p in model.parameters():
            p.requires_grad_(True)
    with GNQAuditor(model, lam=lam, lam_mode=lam_mode, fused=False) as auditor:  # post hoc: no weight grads
        if plans is not None:
            auditor.reuse_plans(plans)
        for n, (index, batch) in enumerate(zip(indices, batches, strict=False)):  # indices may be endless
            t0 = time.perf_counter()
            b = batch.to(device)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            losses = per_example_lm_loss(logits, b.labels, loss)
            auditor.backward(losses.sum())  # output gradients only: no weight-gradient matmuls
            rows, result = score_pass(auditor, logits, b.labels, losses, batch.example_ids, batch_index=index,
                                      step=None, started=t0)
            model.zero_grad(set_to_none=True)
            if kept is not None and n >= kept:
                continue  # a lockstep copy: its batch's rows are another pass's
            texts.add(rows)  # columns to columns: no object per text
            results.append(result)
            if reporter is not None:
                reporter.advance(len(batch.example_ids))
    return texts, results


def run_audit(store: Store | None, checkpoints: str | Path | list[CheckpointRef], dataset: TextDataset, *,
              name: str,
              settings: AuditSettings = AuditSettings(), reporter: Reporter | None = None,
              ranks: Ranks | None = None, tokenizer: str | None = None,
              adapters: Adapters | None = None, shard_model: bool = False) -> Run | None:
    """Audit every checkpoint under ``checkpoints`` (a folder, or the checkpoints found there)
    into run ``name``; resumes an unfinished run.

    Under torchrun every rank calls this with its ``Ranks``: the lead (rank 0) alone opens the
    store (the others pass ``store=None`` and get None back), each rank audits every N-th batch
    of each checkpoint, and the lead writes the gathered rows — the rows one process writes.
    The next checkpoint is loaded in a thread while the current one is audited.  ``tokenizer``:
    a folder to read the tokenizer from, for checkpoints saved without one (recorded in the run's
    settings, so its attack reads the texts alike).  ``adapters``: the checkpoints are PEFT
    adapters of this base model (sources/adapters.py); GNQ over the adapter's parameters, or over
    all parameters of the merged model.  ``shard_model`` (torchrun only): each checkpoint is
    sharded over the ranks with FSDP2 (pipelines/sharding.py), each rank holding 1/N of it; the
    rows are the same.
    """
    reporter = reporter or Reporter()
    ranks = ranks or Ranks()
    if shard_model:
        check_shardable(ranks.world, companions=settings.companions, adapters=adapters is not None)
    if settings.companions not in (None, COMPANIONS_ALL) and ranks.world > 1:
        raise ValueError("--companions N runs in one process: run it without torchrun (--companions all "
                         "runs under torchrun)")
    tokenizer_dir = tokenizer  # the loop below binds each checkpoint's tokenizer to ``tokenizer``
    if adapters is not None and tokenizer_dir is None:
        tokenizer_dir = str(adapters.base)  # the base's tokenizer
    refs = checkpoints if isinstance(checkpoints, list) else find_checkpoints(checkpoints)
    device = ranks.device(resolve_device(settings.device))
    run, plan = None, None
    if ranks.lead:
        assert store is not None, "the lead rank writes the rows: it needs the store"
        try:
            reporter.phase("planning memory")
            settings, plan = _plan_memory(store, refs, name, settings, device, reporter, adapters,
                                          shards=ranks.world if shard_model else 1)
            run, todo, partition = _prepare(store, refs, dataset, name, settings, device, reporter, tokenizer,
                                            adapters)
        except Exception as exc:
            ranks.broadcast(exc)  # the other ranks stop with the same one-line error
            raise
        ranks.broadcast((todo, partition, settings))
    else:
        todo, partition, settings = ranks.broadcast(None)
    dtype = resolve_dtype(settings.dtype)
    prefetch = plan.prefetch if plan is not None else True
    if settings.companions is None:  # the whole run's ETA: every checkpoint's share of the texts
        reporter.expect(len(todo) * sum(partition.size(k) for k in ranks.share(len(partition))))

    # sharded: read into host memory, then each block moved to the device as its shard (sharding.shard)
    load_to = torch.device("cpu") if shard_model else device
    mesh = device_mesh(ranks, device) if shard_model else None

    def load(point: int) -> tuple[torch.nn.Module, Any, str | None]:
        path = refs[point].path
        model, tok = load_audited(path, adapters, device=load_to, dtype=dtype, tokenizer=tokenizer_dir)
        hash_of = checkpoint_hash if adapters is None else adapter_hash
        return model, tok, hash_of(path) if ranks.lead else None

    tracking = store.tracking(run.run_id) if run is not None else contextlib.nullcontext()
    # The checkpoints of a series share their model's structure and the first batch, so the first
    # checkpoint's plan of the model serves the others (checked for each: engine.plan.plan_reuse).
    plans = PlanCache()
    with tracking:
        upcoming = None
        for n, point in enumerate(todo):
            t0 = time.perf_counter()
            # The first checkpoint loads here, so transformers' model modules are imported before
            # the loader thread starts (an interrupt then cannot leave it waiting on the import lock).
            ref = refs[point]
            if upcoming is None:
                reporter.phase(f"loading {ref.label}")
            # Named by the store and keyed by what it is formed from: another store in this folder
            # (or one made again under the same name) never takes up this one's first pass.
            stem = Path(store.path).stem if run else ""
            saved = companions_root(store.path) / f"{stem}-run-{run.run_id}-point-{point}.pt" if run else None
            try:
                model, tokenizer, model_hash = upcoming.result() if upcoming is not None else load(point)
                # the next checkpoint loads while this one is audited, when the plan has room for two
                upcoming = Prefetch(load, todo[n + 1]) if n + 1 < len(todo) and prefetch else None
                if mesh is not None:  # here, not in the loader thread: every rank shards in step
                    _shard(model, mesh, ranks, reporter, first=n == 0)
                key = ({"store": str(Path(store.path).resolve()), "run": run.run_id, "model_hash": model_hash}
                       if run else None)
                texts, results = _audit_share(model, tokenizer, dataset, partition, ref, settings, device,
                                              reporter, ranks, saved, trainable_only=adapters is not None
                                              and not adapters.merged, plans=plans, key=key,
                                              sharded=mesh is not None)
            except Exception as exc:
                if is_out_of_memory(exc) or is_out_of_memory(exc.__cause__):
                    # one line naming the fix; the run stays resumable (failed, finished points kept)
                    raise MemoryError_(oom_message(ref.label, settings.batch_size, plan)) from exc
                raise
            del model
            if run is not None:
                store.write_point(run.run_id, point, texts, results, time.perf_counter() - t0,
                                  path=str(ref.path), model_hash=model_hash)
        if run is not None:  # inside tracking: a numerical failure marks the run 'failed'
            check_mostly_finite(store, run)
    return store.run(run.run_id) if run is not None else None


def _plan_memory(store: Store, refs: list[CheckpointRef], name: str, settings: AuditSettings,
                 device: torch.device, reporter: Reporter, adapters: Adapters | None = None,
                 shards: int = 1) -> tuple[AuditSettings, MemoryPlan]:
    """The settings the audit runs with (the batch size chosen when none was given, the dtype the
    weights are stored in for "auto") and its memory plan (sources.memory_plan), before anything
    loads or is written; a plan that does not fit is refused in one line naming what to change.
    A rerun of an existing run keeps that run's batch size."""
    folder = adapters.base if adapters is not None else refs[0].path
    existing = store.find_run(name)
    if settings.dtype == DTYPE_AUTO:
        kept = existing.dtype if existing is not None and existing.dtype else None
        settings = replace(settings, dtype=kept or model_shape(folder).stored_dtype or "float32")
    batch = settings.batch_size
    if batch is None and existing is not None:
        batch = existing.batch_size
    # unmerged, an adapter's layers add to the base's memory; merged, the model is a base-shaped one
    adapter = refs[0].path if adapters is not None and not adapters.merged else None
    plan, note = check_plan(folder, batch_size=batch, max_length=settings.max_length, dtype=settings.dtype,
                            checkpoints=len(refs), device=str(device), shards=shards, adapter=adapter)
    if note:
        reporter.log(note)
    return replace(settings, batch_size=plan.batch_size), plan


def _prepare(store: Store, refs: list[CheckpointRef], dataset: TextDataset, name: str,
             settings: AuditSettings, device: torch.device,
             reporter: Reporter, tokenizer: str | None = None,
             adapters: Adapters | None = None) -> tuple[Run, list[int], Partition]:
    """The run (created or resumed), the checkpoints still to audit and the batch partition,
    after every check."""
    check_companion_memory(len(dataset), settings)  # known before any pass: refused before any write
    if isinstance(dataset, ChatDataset) and settings.companions is not None:
        raise ValueError("--companions does not take chat data yet (its sketches are over every token): "
                         "audit chat data against their batch")
    spec = _run_spec(refs, dataset, name, settings, device)
    stored = model_shape(adapters.base if adapters is not None else refs[0].path).stored_dtype
    spec = replace(spec, settings=spec.settings | audit_precision(stored, settings.dtype))
    if adapters is not None:
        spec = replace(spec, settings=spec.settings | {"base_model": str(adapters.base.resolve()),
                                                       "parameters": adapters.parameters})
    if tokenizer is not None:
        spec = replace(spec, settings=spec.settings | {"tokenizer": str(Path(tokenizer).resolve())})
    run = store.resumable_run(spec)
    finished = set() if run is None else set(store.points(run.run_id).query("status == 'done'")["point"])
    unfinished = [ref.path for i, ref in enumerate(refs) if i not in finished]
    if adapters is not None:  # one base, each adapter checked against it
        check_checkpoint(adapters.base, settings.max_length, resolve_dtype(settings.dtype), tokenizer)
        for path in unfinished:
            check_adapter(path, adapters.base)
        model_path = adapters.base
    else:
        for path in unfinished:  # a broken checkpoint still to audit: refused before any write
            check_checkpoint(path, settings.max_length, resolve_dtype(settings.dtype), tokenizer)
        check_one_series([Path(r.path) for r in refs], tokenizer)  # one tokenizer, one architecture
        model_path = refs[0].path
    if run is None:
        n_tokens = token_counts(load_tokenizer(model_path, tokenizer), dataset.texts, settings.max_length)
        examples = pd.DataFrame({"example_id": np.arange(len(dataset), dtype=np.int64), "text": dataset.texts,
                                 "grp": dataset.groups, "n_tokens": n_tokens})
        if isinstance(dataset, ChatDataset):
            examples[TURNS_COLUMN] = [layout.to_json() for layout in dataset.layouts]
        run = store.create_run(spec, pd.concat([examples, dataset_labels(dataset)], axis=1))
    else:
        store.set_status(run.run_id, "running")
    store.add_points(run.run_id, [dict(point=i, label=r.label, kind="checkpoint", path=str(r.path))
                                  for i, r in enumerate(refs)])
    done = set(store.points(run.run_id).query("status == 'done'")["point"])
    for i, ref in enumerate(refs):
        if i in done:
            reporter.log(f"{ref.label}: already audited, skipped")
    # Copies in one batch explain each other (GNQ ≈ 1): keep them apart.  A run audited before
    # this rule keeps its plain partition, so all its checkpoints share one partition.
    clusters = cluster_ids(store, run) if run.settings.get("partition") == COPIES_APART else None
    if settings.companions is not None:  # the GNQ batches are the companion sets
        partition = companion_sets(len(dataset), settings, clusters)
    else:
        partition = seeded_partition(len(dataset), settings.batch_size, settings.seed, clusters)
    return run, [i for i in range(len(refs)) if i not in done], partition


def load_audited(path: str | Path, adapters: Adapters | None, *, device: torch.device, dtype: torch.dtype,
                 tokenizer: str | None) -> tuple[torch.nn.Module, Any]:
    """A checkpoint (or a PEFT adapter of ``adapters``' base) loaded and prepared as the audit
    audits it."""
    if adapters is not None:
        model, tok = load_adapter_checkpoint(path, adapters, device=device, dtype=dtype, tokenizer=tokenizer)
    else:
        model, tok = load_checkpoint(path, device=device, dtype=dtype, tokenizer=tokenizer)
    prepare_for_audit(model, dtype)
    return model, tok


def prepare_for_audit(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """No key/value or recurrent cache: an audit never decodes, and a cache updated in place
    (RWKV's state) breaks the backward.  Mixture-of-experts layers as per-expert loops in float64:
    transformers' grouped-matmul kernels take float32/bf16/fp16 only."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "use_cache", False):
        config.use_cache = False
    implementation = getattr(config, "_experts_implementation", None)
    if dtype == torch.float64 and implementation not in (None, "eager"):
        model.set_experts_implementation("eager")


def _audit_share(model: torch.nn.Module, tokenizer: Any, dataset: TextDataset, partition: Partition,
                 ref: CheckpointRef, settings: AuditSettings, device: torch.device, reporter: Reporter,
                 ranks: Ranks, saved: Path | None = None, trainable_only: bool = False,
                 plans: PlanCache | None = None, key: dict | None = None, sharded: bool = False
                 ) -> tuple[ScoreColumns, list[BatchResult]]:
    """This rank's batches of one checkpoint, tokenised batch by batch; on the lead, every rank's
    records in batch order.  Companions against all the texts: every rank takes part in the one
    set (its share of the texts); ``saved``: where that set's first pass is kept.  ``sharded``:
    the model is sharded, so every rank runs as many passes (sharding.lockstep)."""
    mine = ranks.share(len(partition))
    size = sum(partition.size(k) for k in mine)
    reporter.stage(f"{ref.label}", size)
    if settings.companions is not None:
        every = ranks.world > 1  # only --companions all gets here under torchrun: its one set, shared
        return audit_companions(model, tokenizer, dataset.texts, partition,
                                range(len(partition)) if every else mine, settings, device, reporter,
                                trainable_only=trainable_only, ranks=ranks, saved=saved,
                                checkpoint=str(ref.path), plans=plans, key=key)
    runs = lockstep(mine, len(partition), ranks.world) if sharded else mine
    batches = stream_batches(tokenizer, dataset.texts, partition, runs, settings.max_length,
                             trained_masks(dataset))
    rows = audit_batches(model, batches, settings.lam, device, reporter, indices=runs, capacity=size,
                         loss=settings.loss, lam_mode=settings.lam_mode, trainable_only=trainable_only,
                         plans=plans, padding=len(runs) - len(mine))
    parts = ranks.gather(rows)
    if not ranks.lead or len(parts) == 1:
        return rows
    results = sorted((r for p in parts for r in p[1]), key=lambda r: r.batch_index)
    return ScoreColumns.joined([p[0] for p in parts]), results


def _shard(model: torch.nn.Module, mesh: Any, ranks: Ranks, reporter: Reporter, first: bool) -> None:
    """Shard a loaded checkpoint over the ranks; the first time, the lead says what each holds."""
    blocks = shard(model, mesh)
    held = ranks.gather(local_numel(model))
    if first and ranks.lead:
        total = held[0][1]
        shares = ", ".join(f"{h / total:.0%}" for h, _ in held)
        reporter.log(f"model sharded over {ranks.world} ranks (FSDP2: {blocks} blocks and the root): the "
                     f"ranks hold {shares} of its {total:,} parameters")


def trained_masks(dataset: TextDataset):
    """A chat dataset's trained-token masks (``tokens.stream_batches``' ``trained``); None: plain
    texts, every token trained."""
    if not isinstance(dataset, ChatDataset):
        return None
    return lambda i, n: dataset.layouts[i].trained_mask(n)


def _run_spec(refs: list[CheckpointRef], dataset: TextDataset, name: str, settings: AuditSettings,
              device: torch.device) -> RunSpec:
    """The run's description; a rerun must match it (more checkpoints after the stored ones are
    fine: a series that grew as training went on)."""
    return RunSpec(
        name=name, kind="audit", lam=settings.lam, batch_size=settings.batch_size, seed=settings.seed,
        max_length=settings.max_length, model_path=str(Path(refs[0].path).parent if len(refs) > 1
                                                       else refs[0].path),
        dataset_path=str(dataset.path), dataset_hash=dataset.sha256, n_examples=len(dataset),
        code_version=code_version(), device=str(device), dtype=settings.dtype, loss=settings.loss,
        settings={"checkpoints": [r.label for r in refs], "text_column": dataset.text_column,
                  "group_column": dataset.group_column, "partition": COPIES_APART, **secret_settings(dataset),
                  "loss": settings.loss, "lam_mode": settings.lam_mode, **_companion_settings(settings),
                  **chat_settings(dataset)})


def _companion_settings(settings: AuditSettings) -> dict[str, Any]:
    """A companions audit's run settings: N and the sketch (absent for a batch audit, so the
    settings of runs made before companions existed still match on resume)."""
    if settings.companions is None:
        return {}
    return {"companions": settings.companions, "sketch": sketch_spec(settings).describe(),
            "gnq_batch": f"{settings.companions} companions per text (sketched)"}


# The next checkpoint is loaded while this one is audited, in a daemon thread: an interrupted audit
# exits at once (a ThreadPoolExecutor's worker is joined at exit, and once pinned the process for
# 15 minutes waiting on a load blocked on the import lock).
class Prefetch:
    """``fn(arg)`` started in a daemon thread; ``result()`` waits for it (interruptibly) and returns
    its value or raises its exception."""

    def __init__(self, fn: Callable[[Any], Any], arg: Any) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, arg), name="gnq-checkpoint-loader", daemon=True).start()

    def _run(self, fn: Callable[[Any], Any], arg: Any) -> None:
        try:
            self._value = fn(arg)
        except BaseException as exc:  # handed to the main thread by result()
            self._error = exc
        finally:
            self._done.set()

    def result(self) -> Any:
        while not self._done.wait(0.2):  # short waits: a signal reaches the main thread at once
            pass
        if self._error is not None:
            raise self._error
        return self._value
