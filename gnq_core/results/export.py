"""Writing flagged texts to CSV, JSONL or Parquet, atomically (never a half-written file).

CSV is written so that every text reads back exactly (every cell quoted, so a carriage return,
newline, quote or comma inside a text never splits a row) and, by default, safe to open in a
spreadsheet: a text cell that begins with ``=``, ``+``, ``-``, ``@``, a tab, a carriage return or a
newline (or the full-width ``＝ ＋ － ＠``) would be run as a formula by Excel or LibreOffice ("CSV
injection"), so it gets one ``'`` in front, as OWASP recommends.  A cell that already begins with
``'`` gets one too, so removing one leading ``'`` from every cell that has one gives back the exact
text (``strip_formula_guard``).  ``neutralise=False`` (``gnq export --exact-csv``) writes the texts
as they are, for programs that read the CSV.  JSONL and Parquet are typed formats: written as is.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from gnq_core.common.atomic import TargetError, atomic_path, check_target
from gnq_core.errors import GNQError

FORMATS = ("csv", "jsonl", "parquet")
# Cells starting with one of these are escaped with FORMULA_GUARD in CSV exports.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
FORMULA_GUARD = "'"
# Why a CSV cell may begin with ', said the same way by the dashboard and by `gnq export`.
FORMULA_GUARD_NOTE = ("a cell that begins with =, +, - or @ (a phone number such as +1 415…) gets one "
                      "leading ' so a spreadsheet does not run it as a formula (CSV injection); "
                      "`gnq export --exact-csv` writes the texts as they are")


class ExportError(GNQError, ValueError):
    """An export that cannot be written; the message is one line naming the file."""


def _needs_guard(value: object) -> bool:
    return isinstance(value, str) and value.startswith((*FORMULA_STARTS, FORMULA_GUARD))


def _text_columns(frame: pd.DataFrame) -> list:
    return [c for c in frame.columns
            if not (pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]))]


def neutralise_formulas(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text cells (every column) cannot start a spreadsheet formula."""
    out = frame.copy()
    for column in _text_columns(out):
        out[column] = out[column].map(lambda v: FORMULA_GUARD + v if _needs_guard(v) else v)
    return out


def guarded_cells(frame: pd.DataFrame) -> int:
    """How many cells of ``frame`` the CSV formula guard changes (``neutralise_formulas``)."""
    return sum(int(frame[c].map(_needs_guard).sum()) for c in _text_columns(frame))


def strip_formula_guard(text: str) -> str:
    """The exact text of a cell written with the formula guard."""
    return text[1:] if text.startswith(FORMULA_GUARD) else text


def write_table(frame: pd.DataFrame, path: str | Path, fmt: str, *, neutralise: bool = True) -> Path:
    """Write ``frame`` as ``fmt`` to ``path`` via a temporary sibling file and a rename.  Any
    failure (a read-only folder, a full disk, a path under a file) is one ExportError line and
    leaves neither the temporary file nor a changed target."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    path = Path(path)
    try:  # never replace anything but a regular file (a device such as /dev/full, a FIFO, a socket)
        check_target(path, "the export")
    except TargetError as exc:
        raise ExportError(str(exc)) from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"{path}: cannot create its folder {path.parent} ({exc.strerror or exc})") from None
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(to_bytes(frame, fmt, neutralise=neutralise))
    except OSError as exc:
        raise ExportError(f"{path}: cannot write the export ({exc.strerror or exc})") from None
    return path


def to_bytes(frame: pd.DataFrame, fmt: str, *, neutralise: bool = True) -> bytes:
    """The same formats in memory (the dashboard's download buttons)."""
    if fmt == "csv":
        return (neutralise_formulas(frame) if neutralise else frame).to_csv(
            index=False, quoting=csv.QUOTE_ALL, lineterminator="\n").encode()
    if fmt == "jsonl":
        return frame.to_json(orient="records", lines=True, force_ascii=False).encode()
    if fmt == "parquet":
        out = io.BytesIO()
        frame.to_parquet(out, index=False)
        return out.getvalue()
    raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")


EXPORT_COLUMNS = ["example_id", "text", "group", "rank", "percentile", "status", "reason", "risk",
                  "gnq_total", "gnq_max", "gnq_last", "gnq_mean", "gnq_rank", "gnq_percentile",
                  "copies", "cluster_id", "gnq_with_copy", "secret", "secret_start", "secret_end",
                  "secret_match", "secret_values", "public", "loss_last", "self_influence_last", "n_points"]
EXTRACTION_COLUMNS = ["extracted", "extraction_match", "reference_match", "extraction_generated",
                      "loss_ratio", "zlib_ratio", "min_k_prob", "secret_reproduced", "secret_values_attacked",
                      "secret_values_leaked", "secret_values_partly", "secret_kind", "secret_value",
                      "secret_chars",
                      "secret_chars_reproduced", "reference_secret_chars_reproduced", "secret_exposure",
                      "secret_exposure_estimated", "secret_exposed", "secret_exposure_value",
                      "secret_reference_exposure", "secret_exposure_null_p99", "secret_generated"]


def export_frame(ranked: pd.DataFrame, with_extraction: bool) -> pd.DataFrame:
    """The exported columns, in a stable order (``ranked``: analysis.verdict.rank_texts's frame;
    ``rank`` and ``percentile`` are the verdict's, GNQ's own are ``gnq_rank`` / ``gnq_percentile``)."""
    cols = EXPORT_COLUMNS + (EXTRACTION_COLUMNS if with_extraction else [])
    out = ranked[[c for c in cols if c in ranked.columns]].reset_index(drop=True)
    if "turns" in ranked.columns and ranked["turns"].notna().any():  # chat data: the turns, readable
        from gnq_core.sources.chat import ChatLayout

        out.insert(2, "conversation", [ChatLayout.from_json(lay).conversation(text) if isinstance(lay, str)
                                       else text for text, lay in zip(ranked["text"], ranked["turns"],
                                                                      strict=True)])
        if with_extraction:
            for c in ("attack_turn", "attack_turn_trained"):
                if c in ranked.columns:
                    out[c] = ranked[c].to_numpy()
    return out
