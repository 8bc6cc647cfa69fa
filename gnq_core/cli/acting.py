"""``gnq remediate`` and ``gnq compare``: act on a run's verdict (a cleaned training file and a
manifest of every change) and verify it value by value against a run retrained on the cleaned data."""

from __future__ import annotations

from pathlib import Path

import typer

from gnq_core.cli.command import DbOption, QuietOption, app, open_store, say, user_errors


def ranked_texts(store, info):
    """The run's texts in the verdict order, with their status (the one ranking of gnq export)."""
    from gnq_core.analysis.verdict import rank_texts
    from gnq_core.attacks.non_members import ground_truth_of
    from gnq_core.results.text_labels import ensure_text_labels

    ensure_text_labels(store, info)
    return rank_texts(store.example_totals(info.run_id), ground_truth_of(store, info))


def _ids(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise ValueError(f"--remove {text!r}: give text ids separated by commas (e.g. 3,17)") from None


@app.command()
@user_errors
def remediate(
    run: str = typer.Option(..., help="Run name or id whose verdict to act on."),
    out: Path = typer.Option(..., help="The cleaned training file to write, in the data's own format "
                                       "(.txt, .jsonl, .csv or .parquet)."),
    act_on: str = typer.Option("leaked,partly-leaked,exposed", "--act-on",
                               help="Statuses to act on, comma-separated: leaked, partly-leaked, exposed "
                                    "(per value), secret (every secret-like value), text-reproduced, "
                                    "at-risk (repeated texts: deduplicated)."),
    surrogate: bool = typer.Option(False, "--surrogate",
                                   help="Replace a value by a random value of its kind and format "
                                        "(checksum-valid, never a value of the data) instead of a "
                                        "placeholder such as [REDACTED_CARD]."),
    seed: int = typer.Option(0, help="Seed of the surrogates."),
    keep_copies: bool = typer.Option(False, "--keep-copies",
                                     help="Keep every copy of an acted-on text (default: each copy cluster "
                                          "is reduced to its first text, copies being a cause)."),
    remove: str = typer.Option(None, "--remove", show_default=False,
                               help="Text ids to drop besides, comma-separated (the example ids of gnq "
                                    "export)."),
    data: Path = typer.Option(None, "--data", show_default=False,
                              help="The run's training data: when it moved (must be the same bytes), or "
                                   "for a run of the HF Trainer integration, which records no file (its "
                                   "texts must be the run's: same count, same order, equal)."),
    text_column: str = typer.Option(None, "--text-column", show_default=False,
                                    help="The --data file's text column (.csv, .jsonl, .parquet; default: "
                                         "the one the run recorded, else 'text')."),
    manifest: Path = typer.Option(None, "--manifest", show_default=False,
                                  help="The manifest JSON to write (default: OUT.manifest.json)."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Write the run's training data with every leaked, partly leaked and exposed secret value
    replaced, copy clusters reduced to one text and texts to remove dropped, and a manifest (JSON)
    of every change: text, span, kind, SHA-256 of the old value, new value, reason. No value is
    printed."""
    from gnq_core.analysis.remediation import RemediationOptions, remediate_run

    options = RemediationOptions(act_on=tuple(s.strip() for s in act_on.split(",") if s.strip()),
                                 surrogate=surrogate, seed=seed, keep_copies=keep_copies, remove=_ids(remove))
    store = open_store(db, create=False)
    info = store.run(run)
    done = remediate_run(store, info, ranked_texts(store, info), out, options, data=data,
                         manifest_out=manifest, text_column=text_column)
    say(quiet, f"run {info.name!r}: {done.summary()}")


@app.command()
@user_errors
def compare(
    run: str = typer.Option(..., help="The first run (name or id): the one whose values were acted on."),
    with_run: str = typer.Option(..., "--with", help="The second run over the same texts: the original data "
                                                    "audited against the retrained model's checkpoints."),
    json_out: Path = typer.Option(None, "--json", show_default=False,
                                  help="Also write the table as JSON (values masked, with their SHA-256)."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Per secret value of the first run: its status and exposure there and in the second run, every
    value the second model still writes flagged. Values are shown masked (all but two characters)."""
    import hashlib
    import json

    from rich.table import Table

    from gnq_core.analysis.value_compare import STILL, changes_summary, value_changes
    from gnq_core.cli.command import console
    from gnq_core.common.atomic import write_text_atomic
    from gnq_core.results.protected_paths import refuse_overwrite

    store = open_store(db, create=False)
    first, second = store.run(run), store.run(with_run)
    if first.run_id == second.run_id:
        raise ValueError(f"--with {with_run!r}: the same run as --run; give the run to compare with")
    if json_out is not None:
        refuse_overwrite([json_out], store, option="--json")
    frame = value_changes(store.value_outcomes(first.run_id), store.value_outcomes(second.run_id))
    if json_out is not None:
        records = [{**{k: (None if pd_isna(v) else v) for k, v in row.items() if k != "value"},
                    "value_sha256": hashlib.sha256(str(row["value"]).encode("utf-8")).hexdigest()}
                   for row in frame.to_dict("records")]
        write_text_atomic(json_out, json.dumps({"schema": "gnq-value-compare/1", "first": first.name,
                                                "second": second.name, "values": records}, indent=2) + "\n")
    if quiet:
        return
    if not frame.empty:
        table = Table(title=f"Secret values of {first.name!r}, before and after ({second.name!r})")
        for col in ("", "text", "kind", "value", "before", "bits", "after", "bits ", "verdict"):
            table.add_column(col)
        for r in frame.itertuples():
            table.add_row("!" if r.verdict == STILL else "", str(r.text_id), r.kind, r.shown, r.status_before,
                          _bits(r.exposure_before), r.status_after, _bits(r.exposure_after), r.verdict)
        console.print(table)
    say(quiet, changes_summary(frame))


def pd_isna(value: object) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_scalar(value) and pd.isna(value))


def _bits(value: object) -> str:
    return "" if pd_isna(value) or value is None else f"{float(value):.1f}"
