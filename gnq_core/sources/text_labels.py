"""Per-text labels that depend only on the texts: copies (sources/copies.py) and secret-like
content (sources/secrets.py).  The audit and the training compute them where they run
(pipelines/audit.py, pipelines/train.py) and hand them to the store with the run's examples; the
store only keeps them (results/text_labels.py fills in a run stored without them)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import pandas as pd

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
    """What a run records of how its texts' secrets were found (``stored_text_labels`` reuses the
    patterns when the texts are labelled again)."""
    return {"secret_patterns": list(dataset.secret_patterns), "secret_column": dataset.secret_column,
            "public_column": dataset.public_column}


def stored_text_labels(texts: Sequence[str], secret_patterns: Sequence[str], *, where: str,
                       layouts: Sequence[str | None] | None = None) -> pd.DataFrame:
    """``text_labels`` of texts already stored with a run (its recorded ``secret_patterns``, each
    matched in a worker with a time limit: one too slow is refused in one line naming ``where``)."""
    patterns = bounded_patterns(secret_patterns, texts, most=MAX_VALUES_PER_TEXT, where=where)
    return text_labels(texts, patterns, layouts=layouts)
