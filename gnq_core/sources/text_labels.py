"""Per-text labels that depend only on the texts: copies (sources/copies.py) and secret-like
content (sources/secrets.py), computed once per run and kept with its examples."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.sources.boilerplate import own_contents
from gnq_core.sources.chat import ChatDataset
from gnq_core.sources.copies import find_copies
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.secrets import MAX_VALUES_PER_TEXT, secret_labels
from gnq_core.sources.user_patterns import bounded_patterns


def text_labels(texts: Sequence[str], extra_patterns: Sequence[re.Pattern[str]] = (),
                declared: Sequence[Iterable[str]] | None = None,
                public: Sequence[bool] | None = None,
                layouts: Sequence[str | None] | None = None) -> pd.DataFrame:
    """copies, cluster_id, secret, secret_start, secret_end, secret_match, secret_values and
    public per text (input order); ``extra_patterns``, ``declared`` and ``public`` as
    sources.secrets.secret_labels takes them (``--secret-pattern``, ``--secret-column``,
    ``--public-column``).  Copies are found in each text's own content: what the chat template
    wrote (``layouts``: chat texts' stored layouts) and boilerplate most texts share
    (sources/boilerplate.py) belong to no text, so 120 conversations under one system prompt are
    not one cluster."""
    flags = pd.Series([bool(p) for p in public] if public is not None else [False] * len(texts),
                      name="public", dtype="boolean")
    secrets = secret_labels(texts, extra_patterns, declared, public)
    return pd.concat([find_copies(own_contents(texts, layouts)), secrets, flags], axis=1)


def dataset_labels(dataset: TextDataset) -> pd.DataFrame:
    """``text_labels`` of a dataset with its secret column, secret patterns and public column; the
    patterns are first matched over its texts in a worker with a time limit (one too slow is
    refused in one line naming it and the file).  Chat data: each text's turns and template spans
    (its layout), so the template is never a text's content."""
    patterns = bounded_patterns(dataset.secret_patterns, dataset.texts, dataset.public,
                                most=MAX_VALUES_PER_TEXT, where=str(dataset.path))
    layouts = [lay.to_json() for lay in dataset.layouts] if isinstance(dataset, ChatDataset) else None
    return text_labels(dataset.texts, patterns, dataset.secret_values, dataset.public, layouts)


def secret_settings(dataset: TextDataset) -> dict[str, object]:
    """What a run records of how its texts' secrets were found (``ensure_text_labels`` reuses the
    patterns when it labels the texts again)."""
    return {"secret_patterns": list(dataset.secret_patterns), "secret_column": dataset.secret_column,
            "public_column": dataset.public_column}


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
        texts = examples["text"].tolist()
        patterns = bounded_patterns(run.settings.get("secret_patterns") or [], texts,
                                    most=MAX_VALUES_PER_TEXT, where=f"run {run.name!r}")
        layouts = examples["turns"].tolist() if "turns" in examples else None
        labels = text_labels(texts, patterns, layouts=layouts)
        store.write_text_labels(run.run_id, labels.assign(example_id=examples["example_id"].to_numpy()))
