"""Every count a page, the report or the export states about a run's texts, from one object
(the headline, the tiles, the table, the filters and the report agree because they read
the same numbers).

Texts are counted as rows of the verdict (each example once, copies included); ``distinct``
counts collapse copies into one, as the text-first table does (×N).  Values are the secret-like
values the secret attack probed (attacks/secret_attack.py), each counted once.  The exposed values
are counted by ``exposures.exposed`` alone (through ``exposure_summary``): ``values_exposed`` is the
very number the report's ``secret_exposure.exposed`` and the Runs page's tile show.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gnq_core.analysis.clusters import bool_col
from gnq_core.analysis.verdict import LEAKED, SECRET, STATUSES


@dataclass(frozen=True)
class RunCounts:
    texts: int = 0
    by_status: dict[str, int] = field(default_factory=dict)        # rows per status (STATUSES order)
    distinct_by_status: dict[str, int] = field(default_factory=dict)  # copies collapsed
    with_secret: int = 0             # texts holding a secret-like value (public texts hold none)
    values_found: int = 0            # secret-like values found in them
    values_attacked: int = 0         # values the secret attack probed
    values_leaked: int = 0           # written whole (calibrated)
    values_partly: int = 0           # written in part
    window_attacked: int = 0         # texts the text attack's window was tried on
    window_reproduced: int = 0       # texts whose window came out (calibrated)
    leaked_kinds: dict[str, int] = field(default_factory=dict)  # the leaked texts' leaked value kinds
    secret_texts_exposed: int = 0    # texts of status secret (nothing came out) whose value is exposed
    values_distinct: int | None = None  # distinct secret values measured for exposure (None: not read)
    values_exposed: int | None = None   # of them exposed (exposures.exposed; None: not read)

    def status(self, name: str) -> int:
        return int(self.by_status.get(name, 0))

    @property
    def secret_exposed(self) -> int:
        """Old name of ``secret_texts_exposed`` (it read as the exposed values' count, which is
        ``values_exposed``)."""
        warnings.warn("RunCounts.secret_exposed is renamed RunCounts.secret_texts_exposed (texts of status "
                      "secret whose value is exposed); the exposed values are RunCounts.values_exposed",
                      DeprecationWarning, stacklevel=2)
        return self.secret_texts_exposed

    @property
    def attacked(self) -> bool:
        return self.window_attacked > 0 or self.values_attacked > 0

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _sum(frame: pd.DataFrame, name: str) -> int:
    return int(pd.to_numeric(frame[name], errors="coerce").fillna(0).sum()) if name in frame else 0


def _values_in(stored: object) -> int:
    return len(json.loads(stored)) if isinstance(stored, str) and stored else 0


def by_record(ranked: pd.DataFrame):
    """``ranked`` in verdict order grouped by copy cluster (a text without copies is its own):
    the groups' first rows are the records' best-ranked texts (findings.grouped lists them)."""
    frame = ranked.sort_values(["rank", "example_id"]) if "rank" in ranked else ranked
    key = frame["cluster_id"].fillna(frame["example_id"]) if "cluster_id" in frame else frame["example_id"]
    return frame.groupby(key.astype("int64"), sort=False)


def run_counts(ranked: pd.DataFrame, exposure: dict[str, Any] | None = None) -> RunCounts:
    """The counts of ``verdict.rank_texts``'s frame (see the module docstring); ``exposure``: the
    run's ``exposures.exposure_summary``, whose distinct and exposed values it carries (None: those
    two counts are None, not read)."""
    values = {} if exposure is None else {"values_distinct": int(exposure["distinct_values"]),
                                          "values_exposed": int(exposure["exposed"])}
    if ranked.empty or "status" not in ranked:
        return RunCounts(texts=len(ranked), **values)
    status = ranked["status"]
    by_status = {s: int((status == s).sum()) for s in STATUSES}
    first = by_record(ranked).nth(0)
    distinct = {s: int((first["status"] == s).sum()) for s in STATUSES}
    secret = ranked["secret"].notna() if "secret" in ranked else pd.Series(False, index=ranked.index)
    if "secret_values" in ranked:
        found = [max(_values_in(v), 1) for v in ranked.loc[secret, "secret_values"]]
    else:
        found = [1] * int(secret.sum())
    window = ranked["extracted"] if "extracted" in ranked else pd.Series(dtype="boolean")
    leaked_rows = ranked[(status == LEAKED) & secret]
    none = pd.Series(None, index=leaked_rows.index, dtype=object)
    shown = leaked_rows.get("secret_kind", none)
    first = leaked_rows["secret"].astype(str).str.split(",").str[0].str.strip()
    kinds = Counter(str(k) for k in shown.where(shown.notna(), first))
    return RunCounts(
        texts=len(ranked), by_status=by_status, distinct_by_status=distinct, with_secret=int(secret.sum()),
        values_found=int(sum(found)), values_attacked=_sum(ranked, "secret_values_attacked"),
        values_leaked=_sum(ranked, "secret_values_leaked"),
        values_partly=_sum(ranked, "secret_values_partly"),
        window_attacked=int(window.notna().sum()),
        window_reproduced=int(window.astype("boolean").fillna(False).astype(bool).sum()),
        leaked_kinds=dict(kinds.most_common()),
        secret_texts_exposed=int(((status == SECRET) & bool_col(ranked, "secret_exposed")).sum()), **values)


