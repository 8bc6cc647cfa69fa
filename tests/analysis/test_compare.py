"""compare_runs: texts matched across two runs (repeats occurrence by occurrence), ranks, and the
texts that entered or left the top k, checked against a direct computation."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gnq_core.analysis.compare import compare_runs


def _totals(texts: list[str], gnq: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"example_id": range(len(texts)), "text": texts, "group": "g", "gnq_total": gnq})


def test_compare_matches_texts_and_finds_who_entered_and_left_the_top():
    rng = np.random.default_rng(7)
    texts = [f"t{i}" for i in range(30)] + ["same record"] * 3
    a = _totals(texts, rng.lognormal(size=33).tolist())
    b = _totals(texts[::-1], rng.lognormal(size=33).tolist())  # same texts, another order
    b.loc[len(b)] = [33, "only in b", "g", 1.0]
    result = compare_runs(a, b, top=5)
    assert len(result.pairs) == 33 and (result.only_a, result.only_b) == (0, 1)
    expected_a = a.set_index("text")["gnq_total"].drop("same record")
    got = result.pairs.set_index("text")
    for text in [f"t{i}" for i in range(30)]:
        assert got.at[text, "gnq_a"] == expected_a[text]
        assert got.at[text, "gnq_b"] == b.loc[b["text"] == text, "gnq_total"].item()
    # the repeated record: the k-th copy in a (by example id) pairs with the k-th copy in b
    copies_a = a[a["text"] == "same record"]["gnq_total"].tolist()
    copies_b = b[b["text"] == "same record"].sort_values("example_id")["gnq_total"].tolist()
    pairs = result.pairs[result.pairs["text"] == "same record"].sort_values("example_id_a")
    assert pairs["gnq_a"].tolist() == copies_a and pairs["gnq_b"].tolist() == copies_b
    def key(frame: pd.DataFrame) -> set[int]:
        return set(frame["example_id_a"])

    top_a, top_b = key(result.pairs.nlargest(5, "gnq_a")), key(result.pairs.nlargest(5, "gnq_b"))
    assert top_a != top_b
    assert key(result.entered) == top_b - top_a and key(result.left) == top_a - top_b
    assert (result.pairs["rank_change"] == result.pairs["rank_a"] - result.pairs["rank_b"]).all()
    assert -1 <= result.spearman <= 1
