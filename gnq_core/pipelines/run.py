"""One way to run a job: ``run_job(settings, store, progress)`` for the four job kinds of
settings.py (train, audit, extract, demo).  The ``gnq`` commands parse their options into settings
and call it; the dashboard's background job process (jobs.py) calls it for each step of a job
file; the studies share its progress channel (progress.JobProgress).  Each input is loaded,
found and checked once per job: the texts once, the checkpoints found once and handed on.  The
non-members' audit (``--non-members``) is non_member_audit.py's; old imports of its functions from
here still work, with a DeprecationWarning.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gnq_core._lazy import moved_names
from gnq_core.common.progress import JobProgress
from gnq_core.pipelines.settings import AuditJob, DemoJob, ExtractJob, JobSettings, TrainJob
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.sources.datasets import TextDataset

# Moved to pipelines/non_member_audit.py; the old path works for one release.
MOVED = ("add_non_members", "audit_non_members", "non_members_of_audit")
__getattr__ = moved_names(__name__, "gnq_core.pipelines.non_member_audit", MOVED)


def run_job(settings: JobSettings, store: Store | None, progress: JobProgress | None = None) -> list[str]:
    """Run one job into ``store``; returns what to tell the user (one line each).  Progress goes
    through ``progress`` (default: nowhere).  Under torchrun (an audit) only the lead rank writes:
    the others may pass ``store=None``.  Ctrl-C / SIGTERM (KeyboardInterrupt) marks the run
    'cancelled' and keeps what is finished; a rerun resumes."""
    progress = progress or JobProgress(store)
    if threads := getattr(settings, "threads", None):  # torch CPU threads (--threads); None: as is
        import torch

        torch.set_num_threads(threads)
    runners: dict[str, Callable[..., list[str]]] = {
        "train": _train, "audit": _audit, "extract": _extract, "demo": _demo}
    return runners[settings.kind](settings, store, progress)


def _texts(job: TrainJob | AuditJob, progress: JobProgress,
           model: str | Path | Callable[[], Path] | None = None) -> TextDataset:
    """The texts, with a notice of how many rows were skipped for a missing or empty text.  Chat
    data (sources/chat.py) are rendered with the tokenizer of ``model`` (the first checkpoint, or
    the base model of adapters; ``--tokenizer`` when given), and the one line of what was found is
    said."""
    from gnq_core.sources.chat import ChatDataset, load_data

    def tokenizer():
        from gnq_core.sources.checkpoints.tokenizer import load_tokenizer

        if model is None:
            from gnq_core.sources.datasets import DatasetError

            raise DatasetError(job.data, "gnq train trains on plain texts: train on chat data with TRL's "
                                         "SFTTrainer (GNQSFTTrainer gives in-run GNQ) and audit it with gnq "
                                         "audit, or pass --data-format text")
        return load_tokenizer(model() if callable(model) else model, getattr(job, "tokenizer", None))

    dataset = load_data(Path(job.data), tokenizer, data_format=job.data_format, train_on=job.train_on,
                        text_column=job.text_column, group_column=job.group_column,
                        secret_column=job.secret_column, public_column=job.public_column)
    dataset = replace(dataset, secret_patterns=tuple(job.secret_patterns))
    if isinstance(dataset, ChatDataset):
        progress.warn(dataset.found)
    if dataset.dropped:
        progress.warn(f"{job.data}: skipped {dataset.dropped} row(s) whose text is missing, NaN or empty; "
                      f"{len(dataset)} texts remain")
    return dataset


def _warn_unscored(store: Store, run: Run, progress: JobProgress) -> None:
    """The texts a run could not score: one token has no next token to predict (no loss, no
    gradient); a text alone in its GNQ batch has no companions (no GNQ)."""
    if short := store.too_short_to_score(run.run_id):
        progress.warn(f"{short} text(s) have fewer than 2 tokens: no next token to predict, so no GNQ or "
                      "loss (stored as missing, not 0)")
    if alone := store.without_companions(run.run_id):
        progress.warn(f"{alone} text(s) were alone in their GNQ batch (a last batch of one text): no "
                      "companions, so no GNQ (stored as missing; loss and K_jj kept)")


def _train(job: TrainJob, store: Store, progress: JobProgress) -> list[str]:
    from gnq_core.pipelines.train import run_training

    dataset = _texts(job, progress)
    name = job.name or Path(job.out).resolve().name
    progress.plan(None)
    t0 = time.perf_counter()
    with progress.reporter(name) as reporter:
        run = run_training(store, dataset, job.out, name=name, init=job.init, settings=job.settings,
                           reporter=reporter)
    _warn_unscored(store, run, progress)
    said = [f"run {run.name!r} (id {run.run_id}): {len(dataset)} examples × {job.settings.epochs} epochs in "
            f"{time.perf_counter() - t0:.1f} s; checkpoints in {job.out}; store {store.path}"]
    shared, steps = store.steps_with_copies(run.run_id)
    if shared:
        said.append(f"{shared} of {steps} steps had two copies of a text in one batch; those texts' GNQ is "
                    "marked 'measured with a copy in the batch' (gnq_with_copy): copies explain each other")
    return said


def _audit(job: AuditJob, store: Store | None, progress: JobProgress) -> list[str]:
    from gnq_core.pipelines.audit import run_audit
    from gnq_core.pipelines.preflight import audit_inputs
    from gnq_core.pipelines.ranks import Ranks

    ranks = Ranks.from_env()
    if job.shard_model:  # before the texts are read: torchrun is needed whatever they are
        from gnq_core.pipelines.sharding import check_shardable

        check_shardable(ranks.world)
    # the checks every door makes (pipelines/preflight.py), before anything is written; chat data
    # are rendered with the template of the model it reads (an adapter: its base's)
    inputs = audit_inputs(job, texts=lambda model: _texts(job, progress, model))
    dataset, adapters, refs = inputs.dataset, inputs.adapters, inputs.refs
    name = job.name or Path(job.checkpoints).resolve().name
    outside = None
    if job.non_members:  # refused before anything is written
        from gnq_core.pipelines.non_member_audit import non_members_for_audit

        outside = non_members_for_audit(job.non_members, dataset, text_column=job.text_column,
                                        world=ranks.world)
    if not ranks.lead:  # rank 0 alone opens the store and reports
        run_audit(None, refs, dataset, name=name, settings=job.settings, ranks=ranks, tokenizer=job.tokenizer,
                  adapters=adapters, shard_model=job.shard_model)
        ranks.finish()
        return []
    assert store is not None, "the lead rank writes the rows: it needs the store"
    progress.plan(len(refs))  # one stage per checkpoint
    t0 = time.perf_counter()
    with progress.reporter(name) as reporter:
        run = run_audit(store, refs, dataset, name=name, settings=job.settings, reporter=reporter,
                        ranks=ranks, tokenizer=job.tokenizer, adapters=adapters, shard_model=job.shard_model)
    ranks.finish()
    _warn_unscored(store, run, progress)
    said = [f"run {run.name!r} (id {run.run_id}): {len(dataset)} examples × {len(store.points(run.run_id))} "
            f"checkpoints in {time.perf_counter() - t0:.1f} s; store {store.path}"]
    if outside is not None:
        from gnq_core.pipelines.non_member_audit import audit_linked

        said += audit_linked(store, run, refs, outside, job.settings, progress, reference=job.reference)
    return said


def _extract(job: ExtractJob, store: Store, progress: JobProgress) -> list[str]:
    from gnq_core.attacks.run import run_extraction
    from gnq_core.pipelines.non_member_audit import add_non_members, non_members_of_run
    from gnq_core.results.text_labels import ensure_text_labels

    info = store.require_existing().run(job.run)
    outside = non_members_of_run(store, info, job.non_members) if job.non_members else None
    progress.plan(None)
    t0 = time.perf_counter()
    with progress.reporter(info.name) as reporter:
        summary = run_extraction(store, info, checkpoint=job.checkpoint, prefix_tokens=job.prefix_tokens,
                                 suffix_tokens=job.suffix_tokens, threshold=job.threshold,
                                 reference=job.reference, batch_size=job.batch_size, device=job.device,
                                 reporter=reporter, secret_candidates=job.secret_candidates,
                                 exposure_nodes=job.exposure_nodes)
    ensure_text_labels(store, info)
    said = [f"run {info.name!r}, {summary['label']}: {summary['attacked']} texts attacked "
            f"({summary['skipped']} shorter than {job.prefix_tokens} + {job.suffix_tokens} tokens), "
            f"{summary['reproduced']} reproduced, {summary['both_reproduced']} of them also by the "
            f"reference: {summary['extracted']} extracted in {time.perf_counter() - t0:.1f} s"]
    if passages := summary.get("shared_passages"):
        out = [p for p in passages if p["reproduced"]]
        said.append(f"template / boilerplate the model reproduces: {len(out)} of {len(passages)} passage(s) "
                    "most texts share verbatim" + (f" (e.g. {out[0]['passage'][:60]!r})" if out else "")
                    + "; they belong to no text, so no text's window was taken in them")
    if outside is not None:
        said += add_non_members(store, info, outside, progress, device=job.device, reference=job.reference)
    return said


def _demo(job: DemoJob, store: Store, progress: JobProgress) -> list[str]:
    from gnq_core.pipelines.demo import demo_runs, demo_steps

    steps = progress.planned(2 * job.epochs + 2)  # train and audit each epoch, attack both runs
    t0 = time.perf_counter()
    for step in demo_steps(job, store):
        run_job(step, store, steps)
    train_run, audit_run = demo_runs(job)
    return [f"demo runs {audit_run!r}, {train_run!r} built in {time.perf_counter() - t0:.0f} s; "
            f"store {store.path}. Open the dashboard: gnq dashboard (or make app)"]
