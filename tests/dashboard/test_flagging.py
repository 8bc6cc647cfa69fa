"""One filter type for `gnq export` and the Flagged texts page (analysis/flagging.py): each filter
both offer keeps the same texts on both, and the page's other filters hold on the same frame."""

from __future__ import annotations

import pytest
from test_verdict import totals

from gnq_core.analysis import TextFilter, flagged
from gnq_core.analysis.verdict import flag, rank_texts
from gnq_core.dashboard.flagged_filters import Filters
from gnq_core.dashboard.flagged_filters import flagged as page_flagged


@pytest.mark.parametrize(("export", "page"), [
    (dict(top=2), dict(mode="top-k", k=2)),
    (dict(min_percentile=60.0), dict(mode="percentile", percentile=60.0)),
    (dict(min_gnq=3.0), dict(mode="GNQ threshold", min_gnq=3.0)),
    (dict(top=6, group="x"), dict(mode="top-k", k=6, groups=["x"])),
    (dict(top=6, group="y"), dict(mode="top-k", k=6, groups=["y"])),
])
def test_export_and_page_keep_the_same_texts(export, page):
    ranked = rank_texts(totals(group=["x", "y", "x", "y", "x", "y"]))
    by_export = list(flag(ranked, **export)["example_id"])
    assert by_export == list(page_flagged(ranked, Filters(**page))["example_id"])
    assert by_export  # a filter that keeps nothing would agree trivially


def test_filters_combine_and_the_page_only_ones_hold():
    ranked = rank_texts(totals())
    assert list(flagged(ranked, TextFilter(min_gnq=3.0, top=4))["example_id"]) == [1, 2]
    assert list(flagged(ranked, TextFilter(only_secrets=True))["example_id"]) == [0, 3, 1]
    assert list(flagged(ranked, TextFilter(extracted=True))["example_id"]) == [0]
    assert list(flagged(ranked, TextFilter(search="C"))["example_id"]) == [2]
    ranked["gnq_rank"] = ranked["gnq_total"].rank(ascending=False, method="first")  # as the app adds it
    by_gnq = flagged(ranked, TextFilter(order="gnq", top=2))
    assert list(by_gnq["example_id"]) == [2, 4]  # GNQ_total alone: 10, then 5
