"""Two runs over the same texts, side by side: GNQ_total in each, rank changes, and the texts
that entered or left the top k (e.g. before and after a fine-tune, or with another λ)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

PAIR_COLUMNS = ["text", "group", "example_id_a", "example_id_b", "gnq_a", "gnq_b", "rank_a", "rank_b",
                "rank_change"]


@dataclass(frozen=True)
class RunComparison:
    pairs: pd.DataFrame      # one row per text scored in both runs (PAIR_COLUMNS), by rank in b
    entered: pd.DataFrame    # in b's top k, not in a's
    left: pd.DataFrame       # in a's top k, not in b's
    only_a: int              # texts scored in a only
    only_b: int
    spearman: float          # rank correlation of GNQ_total over the shared texts (NaN below 2)


def compare_runs(a: pd.DataFrame, b: pd.DataFrame, top: int = 20) -> RunComparison:
    """Match two runs' per-example totals (example_totals: example_id, text, group, gnq_total) by
    text; a text repeated in the data is matched occurrence by occurrence, in example order.
    Ranks are recomputed over the shared texts (1 = highest GNQ_total); rank_change > 0: higher in b."""
    keyed = []
    for frame in (a, b):
        f = frame[frame["gnq_total"].notna()].sort_values("example_id")
        keyed.append(f.assign(_copy=f.groupby("text").cumcount())[["example_id", "text", "group", "gnq_total",
                                                                    "_copy"]])
    pairs = keyed[0].merge(keyed[1].drop(columns="group"), on=["text", "_copy"], suffixes=("_a", "_b"))
    pairs = pairs.rename(columns={"gnq_total_a": "gnq_a", "gnq_total_b": "gnq_b"})
    for side in ("a", "b"):
        pairs[f"rank_{side}"] = pairs[f"gnq_{side}"].rank(ascending=False, method="first").astype(int)
    pairs["rank_change"] = pairs["rank_a"] - pairs["rank_b"]
    pairs = pairs.sort_values("rank_b").reset_index(drop=True)[PAIR_COLUMNS]
    in_a, in_b = pairs["rank_a"] <= top, pairs["rank_b"] <= top
    spearman = (float(np.corrcoef(pairs["rank_a"], pairs["rank_b"])[0, 1]) if len(pairs) >= 2
                else float("nan"))
    return RunComparison(pairs=pairs, entered=pairs[in_b & ~in_a],
                         left=pairs[in_a & ~in_b].sort_values("rank_a"),
                         only_a=len(keyed[0]) - len(pairs), only_b=len(keyed[1]) - len(pairs),
                         spearman=spearman)
