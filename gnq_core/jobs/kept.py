"""What survives a dashboard job's upload clean-up: the run's last audited checkpoint.

Uploaded checkpoints live in ``<store folder>/uploads/<job>/`` and are deleted when the job ends
(they can be many gigabytes).  The extraction attack, from `gnq extract` or the dashboard, needs
a checkpoint afterwards, by default the last one; so that one is moved (a rename, no copy) to
``<store folder>/kept-checkpoints/`` and its new place is recorded.  The other points' folders
are recorded as gone, so an attack on one says so in one line instead of failing to load it.
An uploaded dataset file is moved there too, and the run's recorded model and dataset paths point
at the kept copies (provenance that still exists; the sha256 of both stays in the run).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from gnq_core.jobs.uploads import inside
from gnq_core.results.layout import kept_root
from gnq_core.results.store import Store


def keep_last_checkpoint(db: str | Path, run_name: str, uploads: Sequence[str | Path]) -> Path | None:
    """Move run ``run_name``'s last finished checkpoint out of ``uploads`` (folders about to be
    deleted) and record where every point under them is now; returns the kept folder, if any."""
    store = Store(db)
    if not Path(db).exists() or (run := store.find_run(run_name)) is None:
        return None
    points = store.points(run.run_id)

    def doomed(path: object) -> bool:
        return bool(path) and any(inside(Path(str(path)), Path(u)) for u in uploads)

    moved: dict[int, str | None] = {int(p.point): None for p in points.itertuples() if doomed(p.path)}
    if not moved:
        return None
    done = points[(points["status"] == "done") & points["point"].isin(list(moved))]
    kept = None
    if not done.empty:
        last = done.iloc[-1]
        kept = kept_root(db) / f"{run.run_id}-{re.sub(r'[^A-Za-z0-9._-]', '_', str(last['label']))}"
        if kept.exists():
            shutil.rmtree(kept)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(last["path"]), kept)
        moved[int(last["point"])] = str(kept)
    store.set_point_paths(run.run_id, moved)
    data = None
    if doomed(run.dataset_path) and Path(run.dataset_path).is_file():
        data = kept_root(db) / f"{run.run_id}-data" / Path(run.dataset_path).name
        data.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(run.dataset_path, data)
    store.set_run_paths(run.run_id, model_path=str(kept) if kept and doomed(run.model_path) else None,
                        dataset_path=str(data) if data else None)
    return kept
