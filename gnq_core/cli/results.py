"""``gnq export``, ``report``, ``runs`` and ``ingest``: what is in the store, written out or loaded in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from gnq_core.cli.command import DbOption, QuietOption, app, console, open_store, say, user_errors, warn
from gnq_core.common.terminal import markup_safe, terminal_safe


@app.command()
@user_errors
def export(
    run: str = typer.Option(..., help="Run name or id."),
    format: str = typer.Option(None, "--format", show_default=False,
                               help="csv, jsonl or parquet (default: from --out's suffix)."),
    out: Path = typer.Option(..., help="File to write."),
    top: int = typer.Option(None, min=1, help="Only the first K of the verdict order."),
    min_percentile: float = typer.Option(None, min=0.0, max=100.0,
                                         help="Only texts at or above this percentile of the verdict order."),
    min_gnq: float = typer.Option(None, help="Only texts with GNQ_total at least this."),
    group: str = typer.Option(None, help="Only this group."),
    status: list[str] = typer.Option(None, "--status", show_default=False,
                                     help="Only texts of this status (repeatable): leaked, 'partly leaked', "
                                          "'text reproduced', secret, 'at risk', low, public."),
    exact_csv: bool = typer.Option(False, "--exact-csv",
                                   help="CSV: write texts exactly, without the ' put before cells starting "
                                        "with = + - @ tab or newline (for programs; unsafe to open in a "
                                        "spreadsheet)."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Write the flagged texts in the verdict order (rank, percentile, status, reason) with GNQ, copies,
    secret-like content, the calibrated attack and membership scores."""
    from gnq_core.analysis.verdict import STATUSES, flag, rank_texts
    from gnq_core.results.export import FORMATS, FORMULA_GUARD_NOTE, export_frame, guarded_cells, write_table
    from gnq_core.results.protected_paths import refuse_overwrite
    from gnq_core.results.text_labels import ensure_text_labels

    if format is None:
        format = out.suffix.lstrip(".").lower()
        if format not in FORMATS:
            raise ValueError(f"{out}: cannot tell the format from the suffix; give --format "
                             f"({', '.join(FORMATS)})")
    if format not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    unknown = [s for s in status or () if s not in STATUSES]
    if unknown:
        raise ValueError(f"--status {unknown[0]!r} is not a status ({', '.join(STATUSES)})")
    store = open_store(db, create=False)
    info = store.run(run)
    refuse_overwrite([out], store)  # never onto the store, its WAL, a dataset or a checkpoint
    ensure_text_labels(store, info)
    from gnq_core.attacks.non_members import ground_truth_of

    ranked = rank_texts(store.example_totals(info.run_id), ground_truth_of(store, info))
    flagged = flag(ranked, top=top, min_percentile=min_percentile,
                   min_gnq=min_gnq, group=group, statuses=tuple(status or ()))
    has_attack = not store.extractions(info.run_id).empty
    table = export_frame(flagged, has_attack)
    write_table(table, out, format, neutralise=not exact_csv)
    say(quiet, f"{len(flagged)} texts of run {info.name!r} written to {out}")
    guarded = guarded_cells(table) if format == "csv" and not exact_csv else 0
    if guarded:  # the ' a spreadsheet user sees before "+351 …" is explained where it appears
        say(quiet, f"{guarded} cell(s) begin with ': in the CSV, {FORMULA_GUARD_NOTE}.")


@app.command()
@user_errors
def report(
    run: str = typer.Option(..., help="Run name or id."),
    out: Path = typer.Option(None, help="HTML file to write (one self-contained file; opens offline)."),
    json_out: Path = typer.Option(None, "--json", help="JSON file to write: every table of the run "
                                                       "(schema gnq-report/2, docs/DESIGN.md §8)."),
    top: int = typer.Option(50, min=1, help="Rows of the verdict table."),
    resamples: int = typer.Option(1000, min=10, help="Bootstrap resamples of the predictive-power "
                                                     "intervals."),
    seed: int = typer.Option(0, help="Seed of the bootstrap and the cross-validation folds."),
    non_members: Path = typer.Option(None, "--non-members", show_default=False,
                                     help="Texts the model never saw (an audit run): audited over its "
                                          "checkpoints first, unless this file already was."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Write a run's report to hand on: provenance, what GNQ is on this run, verdict table,
    predictive power (all texts, exact length, gain over length + loss), top texts; as HTML
    (--out) and/or JSON (--json)."""
    from gnq_core.analysis import run_report
    from gnq_core.analysis.html_report import build_report, check_writable, write_report
    from gnq_core.results.protected_paths import refuse_overwrite
    from gnq_core.results.store_schema import StoreError

    if out is None and json_out is None:
        raise ValueError("give --out FILE.html and/or --json FILE.json")
    store = open_store(db)
    if not store.path.is_file():
        raise StoreError(f"{store.path}: no store here (build one with gnq train/audit/demo, or pass --db)")
    info = store.run(run)
    for path in (out, json_out):
        if path is not None:
            check_writable(path)  # first: "is a folder", "does not exist" name the problem best
    for path, option in ((out, "--out"), (json_out, "--json")):
        if path is not None:  # never onto the store, what a run depends on, or --non-members
            refuse_overwrite([path], store, inputs=[non_members], option=option)
    if out is not None and json_out is not None and Path(out).resolve() == Path(json_out).resolve():
        raise ValueError(f"{out}: given as both --out and --json; give two files")
    if non_members is not None:
        from gnq_core.common.progress import JobProgress
        from gnq_core.pipelines.non_member_audit import add_non_members

        progress = JobProgress(store, quiet=quiet, warn=warn)
        for line in add_non_members(store, info, str(non_members), progress,
                                    reference=info.settings.get("attack", {}).get("reference")):
            say(quiet, line)
        info = store.run(info.run_id)  # its settings now name the non-member run
    from gnq_core.attacks.non_members import membership_of

    data = run_report.build(store, info, resamples=resamples, seed=seed,
                            membership=membership_of(store, info))
    if json_out is not None:
        run_report.write_json(data, json_out)
        say(quiet, f"tables of run {info.name!r} written to {json_out}")
    if out is not None:
        text = build_report(store, info, top=top, resamples=resamples, seed=seed,
                            command=" ".join(["gnq", *sys.argv[1:]]), data=data)
        write_report(text, out)
        say(quiet, f"report of run {info.name!r} written to {out} ({len(text) / 1e6:.1f} MB)")


@app.command()
@user_errors
def runs(
    db: Path = DbOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The runs in the store with their settings and status."""
    store = open_store(db, create=False)
    frame = store.runs()
    if as_json:
        records = json.loads(frame.to_json(orient="records", date_format="iso"))
        for r in records:
            if isinstance(r.get("settings"), str):
                r["settings"] = json.loads(r["settings"])
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
        return
    if frame.empty:
        console.print(markup_safe(f"{store.path}: no runs yet (try `gnq demo`)"))
        return
    rows = [[terminal_safe(v) for v in (
        r.run_id, r.name, r.kind, r.status, r.n_examples, f"{r.points_done}/{r.points_total}", f"{r.lam:g}",
        r.batch_size, r.seed, r.max_length, r.extraction_rows, _minute(r.updated_at))]
        for r in frame.itertuples()]  # names come from users and folder names: shown as plain, safe text
    keep = fit_columns(RUN_COLUMNS, rows, console.width, RUN_COLUMNS_DROPPED_FIRST)
    left_out = [c for i, c in enumerate(RUN_COLUMNS) if i not in keep]
    table = Table(title=markup_safe(f"Runs in {store.path}"),
                  caption=f"{', '.join(left_out)}: left out to fit {console.width} columns "
                          "(a wider terminal or --json shows them)" if left_out else None)
    for i in keep:
        # A run name is what the other commands take: shown whole, never cut to "demo-aud…"; where
        # even the columns kept do not fit (a long name), the others fold onto a second line, not "20…"
        table.add_column(RUN_COLUMNS[i], no_wrap=RUN_COLUMNS[i] == "name", overflow="fold")
    for row in rows:
        table.add_row(*(Text(row[i]) for i in keep))
    console.print(table)


RUN_COLUMNS = ("id", "name", "kind", "status", "examples", "points", "λ", "B", "seed", "max len",
               "attacked", "updated")
# On a narrow terminal these go first (settings `gnq runs --json` gives in full), so the columns a
# user acts on (which run, its status, how far it got, when) are shown whole rather than all cut to "st…".
RUN_COLUMNS_DROPPED_FIRST = ("max len", "seed", "B", "λ", "attacked", "kind", "examples")


def fit_columns(header: tuple[str, ...], rows: list[list[str]], width: int,
                drop_order: tuple[str, ...]) -> list[int]:
    """Indices of the columns to show: all of them when the table fits ``width`` cells, else the
    columns of ``drop_order`` left out in turn until it fits (or none are left to drop)."""
    need = [max(cell_len(c) for c in (h, *(row[i] for row in rows))) for i, h in enumerate(header)]
    keep = list(range(len(header)))
    drops = iter(header.index(name) for name in drop_order)
    # rich's default box: one cell of padding each side and a rule between and around the columns
    while sum(need[i] + 3 for i in keep) + 1 > width:
        i = next(drops, None)
        if i is None:
            break
        keep.remove(i)
    return keep


def _minute(stamp: object) -> str:
    """A timestamp to the minute ("2026-11-28 00:01"): the seconds and microseconds cost 10 columns."""
    return str(stamp)[:16]


@app.command()
@user_errors
def ingest(
    shards: Path = typer.Argument(..., help="A shards folder written by a distributed run (run.json, "
                                            "scores/, batches/)."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Load a run's Parquet shards into the store (one transaction; ingesting again replaces, never
    duplicates)."""
    from gnq_core.results.shards import ingest as ingest_shards

    store = open_store(db)
    run, counts = ingest_shards(store, shards)
    say(quiet, f"run {run.name!r} (id {run.run_id}, {run.status}): {counts['scores']} scores, "
                 f"{counts['batches']} batches, {counts['points']} points from {shards}; store {store.path}")
