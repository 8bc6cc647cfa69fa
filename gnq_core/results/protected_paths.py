"""No command's output may overwrite or stand in for a file the tool depends on: the store and its
WAL, any run's dataset, any run's checkpoint folders (its points) and training run folders, the
tokenizer folder, starting checkpoint, reference model and non-member texts a run recorded, and the
command's own inputs (all recorded absolute, so a later command in another folder finds them).
A target is refused when it is such a path, lies inside one, or holds one (a checkpoint folder is
replaced whole).  Checked before anything is written."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from gnq_core.errors import GNQError
from gnq_core.results.store import Store


class OverwriteError(GNQError, ValueError):
    """An output path that would replace something the tool depends on."""


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def depended_on(store: Store, *, except_run: int | None = None) -> list[tuple[Path, str]]:
    """(path, what it is) for everything in ``store``'s keeping that an output must leave alone."""
    paths = [(Path(store.path), "the store"), (Path(f"{store.path}.wal"), "the store's WAL")]
    if not Path(store.path).exists():
        return paths
    for run in store.runs().itertuples():
        if run.run_id == except_run:
            continue
        paths.append((Path(run.dataset_path), f"run {run.name!r}'s dataset"))
        if run.kind == "train":
            paths.append((Path(run.model_path), f"run {run.name!r}'s run folder"))
        paths += [(Path(p), f"run {run.name!r}'s checkpoint") for p in store.points(run.run_id)["path"]
                  if isinstance(p, str) and p]
        paths += [(Path(p), f"run {run.name!r}'s {what}") for p, what in _recorded_inputs(run.settings)]
    return paths


def _recorded_inputs(settings: object) -> list[tuple[str, str]]:
    """(path, what it is) for the inputs a run's settings name beyond its dataset and checkpoints."""
    if isinstance(settings, str):
        try:
            settings = json.loads(settings)
        except ValueError:
            return []
    if not isinstance(settings, dict):
        return []
    attack = settings.get("attack") if isinstance(settings.get("attack"), dict) else {}
    named = [(settings.get("tokenizer"), "tokenizer folder"), (settings.get("init"), "starting checkpoint"),
             (settings.get("non_members_path"), "non-member texts"),
             (settings.get("reference"), "reference model"), (attack.get("reference"), "reference model")]
    return [(p, what) for p, what in named if isinstance(p, str) and p and p != "first"]


def refuse_overwrite(targets: Iterable[str | Path], store: Store, *, inputs: Iterable[str | Path] = (),
                     except_run: int | None = None, option: str = "--out") -> None:
    """Raise OverwriteError (one line naming both paths) when writing ``targets`` would replace or
    write into the store, its WAL, a run's dataset or checkpoints, or one of ``inputs``."""
    protected = [(Path(p).resolve(), "an input of this command") for p in inputs if p]
    protected += [(p.resolve(), what) for p, what in depended_on(store, except_run=except_run)]
    for target in targets:
        resolved = Path(target).resolve()
        for path, what in protected:
            if _overlap(resolved, path):
                raise OverwriteError(f"{target}: {option} would overwrite {what} ({path}); choose another "
                                     f"{option}")


def verify_checkpoint(path: str | Path, expected_hash: object, what: str) -> None:
    """A checkpoint reused after it was recorded (attacked, resumed from) must be the one recorded:
    its weights' hash against the stored ``model_hash``; refused in one line when it differs."""
    from gnq_core.sources.adapters import adapter_hash, is_adapter_checkpoint
    from gnq_core.sources.checkpoints.checks import check_checkpoint
    from gnq_core.sources.checkpoints.errors import CheckpointError
    from gnq_core.sources.checkpoints.files import checkpoint_hash

    if not isinstance(expected_hash, str) or not expected_hash:
        return  # recorded without a hash (older stores): nothing to compare with
    adapter = is_adapter_checkpoint(path)
    if (adapter_hash(path) if adapter else checkpoint_hash(path)) != expected_hash:
        if not adapter:
            check_checkpoint(path)  # a damaged file is named as such; else it is another model
        raise CheckpointError(f"{path}: {what} has changed since it was recorded (its weights' hash "
                              f"differs from the store's {expected_hash[:12]}…); restore it, or audit it "
                              "again as a new run")
