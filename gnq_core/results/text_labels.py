"""The per-text labels (copies, secret-like content) of a stored run.  They are computed where a
run is made (sources/text_labels.py, called by the audit and the training) and stored with its
examples; a run stored without them (made before the labels existed, or ingested from the Trainer
integration's shards) is labelled from its stored texts the first time a reader needs them.

``text_labels``, ``dataset_labels`` and ``secret_settings`` moved to sources/text_labels.py; their
old path here still works for one release, with a DeprecationWarning."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gnq_core._lazy import moved_names
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.sources.text_labels import stored_text_labels

MOVED = ("dataset_labels", "secret_settings", "text_labels")
__getattr__ = moved_names(__name__, "gnq_core.sources.text_labels", MOVED)


def ensure_text_labels(store: Store, run: Run) -> pd.DataFrame:
    """The run's examples with their labels, computing and storing them if missing (runs created
    before the labels existed, or by the Trainer integration)."""
    _label_if_missing(store, run)
    return store.examples(run.run_id)


def cluster_ids(store: Store, run: Run) -> np.ndarray:
    """Each example's copy cluster (labelling the texts first if needed), without reading the
    texts when their labels are stored."""
    _label_if_missing(store, run)
    return store.cluster_ids(run.run_id)


def _label_if_missing(store: Store, run: Run) -> None:
    if store.text_labels_missing(run.run_id):
        examples = store.examples(run.run_id)
        labels = stored_text_labels(examples["text"].tolist(), run.settings.get("secret_patterns") or [],
                                    where=f"run {run.name!r}",
                                    layouts=examples["turns"].tolist() if "turns" in examples else None)
        store.write_text_labels(run.run_id, labels.assign(example_id=examples["example_id"].to_numpy()))
