"""Which scored texts to flag, one filter type for ``gnq export`` and the Flagged texts page: every
filter given must hold (the page offers top-k, a percentile or a GNQ threshold one at a time; the
command line may combine them).  Applies to ``verdict.rank_texts``'s frame."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

VERDICT_ORDER, GNQ_ORDER = "verdict", "gnq"  # the verdict's ranks, or GNQ_total's alone


@dataclass(frozen=True)
class TextFilter:
    order: str = VERDICT_ORDER
    top: int | None = None             # the first k of the order (before the other filters)
    min_percentile: float | None = None  # at or above this percentile of the order
    min_gnq: float | None = None       # GNQ_total at least this
    groups: tuple[str, ...] = ()       # any of these groups (none: all)
    search: str = ""                   # the text contains this (case-insensitive)
    extracted: bool | None = None      # only texts the attack did (True) or did not (False) extract
    only_secrets: bool = False         # only texts with secret-like content
    statuses: tuple[str, ...] = ()     # any of these statuses (verdict.STATUSES; none: all)

    @property
    def rank_columns(self) -> tuple[str, str]:
        return ("rank", "percentile") if self.order == VERDICT_ORDER else ("gnq_rank", "gnq_percentile")


def flagged(ranked: pd.DataFrame, f: TextFilter) -> pd.DataFrame:
    """The texts ``f`` keeps, in its order (rank, then example id), indexed 0..n-1."""
    rank_col, pct_col = f.rank_columns
    keep = pd.Series(True, index=ranked.index)
    if f.top is not None:
        keep &= ranked.index.isin(ranked.sort_values([rank_col, "example_id"]).head(int(f.top)).index)
    if f.min_percentile is not None:
        keep &= ranked[pct_col] >= f.min_percentile
    if f.min_gnq is not None:
        gnq = ranked["gnq_total"] if "gnq_total" in ranked else pd.Series(float("nan"), index=ranked.index)
        keep &= gnq >= f.min_gnq
    if f.groups:
        keep &= ranked["group"].isin(list(f.groups))
    if f.search:
        keep &= ranked["text"].str.contains(f.search, case=False, regex=False)
    if f.extracted is not None and "extraction_match" in ranked and ranked["extraction_match"].notna().any():
        keep &= ranked["extracted"].fillna(False).astype(bool) == f.extracted
    if f.only_secrets:
        keep &= ranked["secret"].notna()
    if f.statuses:
        keep &= ranked["status"].isin(list(f.statuses))
    return ranked[keep].sort_values([rank_col, "example_id"]).reset_index(drop=True)
