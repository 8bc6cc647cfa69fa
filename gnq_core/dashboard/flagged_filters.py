"""The Flagged texts page's filters as one value, drawn and kept in the address by the page
(dashboard/views/flagged.py); applied as gnq_core's TextFilter, the filter type ``gnq export`` uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from gnq_core.analysis import GNQ_ORDER, STATUSES, VERDICT_ORDER, TextFilter
from gnq_core.analysis import flagged as flag_texts

VERDICT, BY_GNQ = "Verdict (leaked, secret-like, risk)", "GNQ_total alone"
ORDERS = (VERDICT, BY_GNQ)
MODES = ("top-k", "percentile", "GNQ threshold")
EXTRACTION = ("all", "extracted", "not extracted")  # the text attack's window (calibrated)
STATUS_CHOICES = ("all", *STATUSES)  # the verdict's statuses: the counts the Runs page states


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
    status: str = "all"

    def text_filter(self) -> TextFilter:
        """The page's choices as the shared filter: the one "Flag by" mode picked, and the rest."""
        return TextFilter(order=VERDICT_ORDER if self.order == VERDICT else GNQ_ORDER,
                          top=int(self.k) if self.mode == "top-k" else None,
                          min_percentile=self.percentile if self.mode == "percentile" else None,
                          min_gnq=self.min_gnq if self.mode == "GNQ threshold" else None,
                          groups=tuple(self.groups), search=self.search,
                          extracted=None if self.extraction == "all" else self.extraction == "extracted",
                          only_secrets=self.only_secrets,
                          statuses=() if self.status == "all" else (self.status,))


def flagged(scored: pd.DataFrame, f: Filters) -> pd.DataFrame:
    """The texts the filters keep, in the chosen order (rank, then example id)."""
    return flag_texts(scored, f.text_filter())
