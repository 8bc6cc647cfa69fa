"""The Flagged texts page's filters as one value: applied to the scored texts here, drawn and kept
in the address by the page (app/views/flagged.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

VERDICT, BY_GNQ = "Verdict (leaked, secret-like, risk)", "GNQ_total alone"
ORDERS = (VERDICT, BY_GNQ)
MODES = ("top-k", "percentile", "GNQ threshold")
EXTRACTION = ("all", "extracted", "not extracted")


@dataclass(frozen=True)
class Filters:
    order: str = VERDICT
    mode: str = "top-k"
    k: int = 50
    percentile: float = 90.0
    min_gnq: float = 0.0
    search: str = ""
    groups: list[str] = field(default_factory=list)
    extraction: str = "all"
    only_secrets: bool = False

    @property
    def rank_columns(self) -> tuple[str, str]:
        return ("rank", "percentile") if self.order == VERDICT else ("gnq_rank", "gnq_percentile")


def flagged(scored: pd.DataFrame, f: Filters) -> pd.DataFrame:
    """The texts the filters keep, in the chosen order (rank, then example id)."""
    rank_col, pct_col = f.rank_columns
    if f.mode == "top-k":
        view = scored.sort_values(rank_col).head(int(f.k))
    elif f.mode == "percentile":
        view = scored[scored[pct_col] >= f.percentile]
    else:
        view = scored[scored["gnq_total"] >= f.min_gnq]
    if f.groups:
        view = view[view["group"].isin(f.groups)]
    if f.search:
        view = view[view["text"].str.contains(f.search, case=False, regex=False)]
    if f.extraction != "all" and scored["extraction_match"].notna().any():
        view = view[view["extracted"].fillna(False).astype(bool) == (f.extraction == "extracted")]
    if f.only_secrets:
        view = view[view["secret"].notna()]
    return view.sort_values([rank_col, "example_id"])
