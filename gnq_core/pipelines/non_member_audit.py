"""Auditing a run's non-members: the texts of ``--non-members FILE`` audited over the members'
checkpoints with the members' settings, into the linked run ``NAME.non-members`` that
attacks/non_members.py reads as membership ground truth.  An audit, so it lives with the
pipelines (attacks/ is below the audit it would run); run.py calls it from ``gnq audit`` and
``gnq extract``, cli/results.py from ``gnq report --non-members``.  Every input is checked before
anything is written: the file's texts are no members, and the run can take them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gnq_core.attacks.non_members import (
    SUFFIX,
    check_disjoint,
    check_run_takes_non_members,
    store_reference_loss,
)
from gnq_core.common.progress import JobProgress, Reporter
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.sources.checkpoints.files import CheckpointRef
from gnq_core.sources.datasets import TextDataset, load_texts


def non_members_for_audit(path: str | Path, members: TextDataset, *, text_column: str | None = None,
                          world: int = 1) -> TextDataset:
    """The texts of ``gnq audit --non-members FILE``, refused before the members' audit writes
    anything: a file that shares a text with the members, or an audit under torchrun (the linked
    audit runs in one process)."""
    if world > 1:
        raise ValueError("--non-members runs in one process: audit them without torchrun")
    outside = load_texts(Path(path), text_column=text_column)
    check_disjoint(members.texts, outside)
    return outside


def non_members_of_run(store: Store, info: Run, path: str | Path) -> TextDataset:
    """The non-member texts of a stored run (``gnq extract``/``gnq report --non-members``), checked
    before anything is written."""
    outside = load_texts(Path(path))
    check_run_takes_non_members(store, info, outside)
    return outside


def audit_linked(store: Store, member: Run, refs: list[CheckpointRef], outside: TextDataset,
                 settings: AuditSettings, progress: JobProgress, *,
                 reference: str | None = None) -> list[str]:
    """``audit_non_members`` right after the members' audit (``gnq audit --non-members``), with
    its progress bar; returns the line to tell."""
    return _timed(progress, member.name + SUFFIX, len(outside), lambda reporter: audit_non_members(
        store, member, refs, outside, settings, reporter, reference=reference))


def add_non_members(store: Store, info: Run, outside: TextDataset | str, progress: JobProgress, *,
                    device: str = "auto", reference: str | None = None) -> list[str]:
    """Audit ``outside`` (texts or their file) as the stored audit run's non-members, unless the
    same file content already was (``gnq extract``/``gnq report --non-members``)."""
    if not isinstance(outside, TextDataset):
        outside = non_members_of_run(store, info, outside)
    if info.settings.get("non_members_hash") == outside.sha256 and store.find_run(info.name + SUFFIX):
        return []
    return _timed(progress, info.name + SUFFIX, len(outside), lambda reporter: non_members_of_audit(
        store, info, outside, device=device, reporter=reporter, reference=reference))


def _timed(progress: JobProgress, name: str, texts: int, audit: Callable[[Reporter], Run]) -> list[str]:
    """Run ``audit`` under a progress bar named ``name``; the line that says what it built."""
    t0 = time.perf_counter()
    with progress.reporter(name) as reporter:
        other = audit(reporter)
    return [f"non-members: run {other.name!r}, {texts} texts in {time.perf_counter() - t0:.1f} s"]


def audit_non_members(store: Store, member: Run, checkpoints: str | list[CheckpointRef], dataset: TextDataset,
                      settings: AuditSettings, reporter: Reporter | None = None,
                      reference: str | None = None) -> Run:
    """Audit ``dataset`` over ``checkpoints`` into ``member``'s linked non-member run (resumes);
    with ``reference`` (a checkpoint folder, or "first": the series' first checkpoint) the
    reference model's loss of every member and non-member text is stored too."""
    from gnq_core.pipelines.audit import run_audit
    from gnq_core.sources.checkpoints.series import find_checkpoints

    check_disjoint(list(store.examples(member.run_id)["text"]), dataset)
    refs = checkpoints if isinstance(checkpoints, list) else find_checkpoints(checkpoints)
    # the members' batch size and dtype (the memory plan's when none was given): GNQ alike
    settings = replace(settings, batch_size=member.batch_size, dtype=member.dtype or settings.dtype)
    name = member.name + SUFFIX
    run = run_audit(store, refs, dataset, name=name, settings=settings, reporter=reporter)
    store.update_settings(run.run_id, {"non_members_of": member.name})
    store.update_settings(member.run_id, {"non_members_run": name, "non_members_path": str(dataset.path),
                                          "non_members_hash": dataset.sha256})
    if reference is not None:
        path = refs[0].path if reference == "first" else Path(reference).resolve()
        store.update_settings(member.run_id, {"reference": str(path)})  # absolute: protected from outputs
        for target in (member, run):
            store_reference_loss(store, target, path, max_length=settings.max_length,
                                 batch_size=member.batch_size)
    return store.run(run.run_id)


def non_members_of_audit(store: Store, run: Run, dataset: TextDataset, *, device: str = "auto",
                         reporter: Reporter | None = None, reference: str | None = None) -> Run:
    """``audit_non_members`` for a stored audit run, with its own settings and checkpoints (what
    ``gnq extract --non-members`` does), after ``check_run_takes_non_members``."""
    check_run_takes_non_members(store, run, dataset)
    settings = AuditSettings(lam=run.lam, batch_size=run.batch_size, max_length=run.max_length, seed=run.seed,
                             device=device, dtype=run.dtype or "float32",
                             loss=run.settings.get("loss", "token_mean"),
                             lam_mode=run.settings.get("lam_mode", "absolute"))
    return audit_non_members(store, run, run.model_path, dataset, settings, reporter, reference)
