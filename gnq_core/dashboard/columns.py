"""Table columns with a tooltip that says what each value and scale means
(gnq_core.analysis.verdict.COLUMN_HELP), shared by every page that shows per-text results."""

from __future__ import annotations

from collections.abc import Iterable

import streamlit as st

from gnq_core.analysis import COLUMN_HELP, SHOWN_HELP, VALUES_HELP
from gnq_core.catalog import SIGNALS

# a signal's label and number format are its catalog entry's (gnq_core/catalog/signals.py)
_FORMATS = {s.column: s.fmt for s in SIGNALS if s.fmt.endswith(("f", "g"))} | {
    "percentile": "%.1f", "gnq_percentile": "%.1f", "extraction_match": "%.2f", "reference_match": "%.2f"}
_LABELS = {s.column: s.label for s in SIGNALS if s.column != "risk"} | {
    "gnq_rank": "GNQ rank", "gnq_percentile": "GNQ percentile", "gnq_with_copy": "GNQ with a copy",
    "extraction_match": "match", "reference_match": "reference match", "secret": "secret-like",
    "secret_match": "secret match"}


def column_config(columns: Iterable[str]) -> dict:
    """st.dataframe column_config for ``columns``: a readable label, a number format and the help
    tooltip for every column that has one."""
    config = {}
    for c in columns:
        label, help_ = _LABELS.get(c, c), COLUMN_HELP.get(c)
        if c in _FORMATS:
            config[c] = st.column_config.NumberColumn(label, help=help_, format=_FORMATS[c])
        elif c == "extracted":
            config[c] = st.column_config.CheckboxColumn(label, help=help_)
        elif help_ is not None or c in _LABELS:
            config[c] = st.column_config.Column(label, help=help_)
    return config


# the drill-down's secret attack table: labels, and the exposure columns' help (analysis.exposures)
_SECRET_LABELS = {"generated": "the model wrote", "chars_reproduced": "characters reproduced",
                  "reference_generated": "the reference wrote",
                  "reference_chars_reproduced": "reference: characters",
                  "exposure": "exposure (bits)", "exposure_method": "rank: exact or estimated",
                  "exposure_rank": "rank in its space", "exposure_template": "its format (# free)",
                  "reference_exposure": "reference (bits)",
                  "exposure_null_p99": "never-trained 99th pct (bits)",
                  "exposed": "exposed", "value_copies": "copies of the value"}
_BITS = ("exposure", "reference_exposure", "exposure_null_p99")


def secret_attack_config() -> dict:
    """column_config of the secret attack's table: readable labels, bits to one decimal, and what
    each exposure number is measured against as its help."""
    config = {}
    for c, label in _SECRET_LABELS.items():
        help_ = VALUES_HELP[SHOWN_HELP[c]] if c in SHOWN_HELP else None
        config[c] = (st.column_config.NumberColumn(label, format="%.1f", help=help_) if c in _BITS else
                     st.column_config.CheckboxColumn(label, help=help_) if c == "exposed" else
                     st.column_config.Column(label, help=help_))
    return config
