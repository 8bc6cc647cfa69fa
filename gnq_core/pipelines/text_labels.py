"""Per-text labels that depend only on the texts: copies (sources/copies.py) and secret-like
content (sources/secrets.py), computed once per run and kept with its examples."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from gnq_core.results.store import Run, Store
from gnq_core.sources.copies import find_copies
from gnq_core.sources.secrets import secret_labels


def text_labels(texts: Sequence[str]) -> pd.DataFrame:
    """copies, cluster_id, secret, secret_start, secret_end, secret_match per text (input order)."""
    return pd.concat([find_copies(texts), secret_labels(texts)], axis=1)


def ensure_text_labels(store: Store, run: Run) -> pd.DataFrame:
    """The run's examples with their labels, computing and storing them if missing (runs created
    before the labels existed, or by the Trainer integration)."""
    examples = store.examples(run.run_id)
    if len(examples) and examples["copies"].isna().any():
        labels = text_labels(examples["text"].tolist())
        store.write_text_labels(run.run_id, labels.assign(example_id=examples["example_id"].to_numpy()))
        examples = store.examples(run.run_id)
    return examples
