"""``python -m research study NAME``: the paper's studies, each a set of runs plus a report.  A
program of its own beside the ``gnq`` command, because research/ is not installed with gnq-audit:
run it from a clone (the repository root on the path).  The options are the ones ``gnq study`` took
(it now forwards here, deprecated); each study is imported when its command runs (torch and the
models load only then)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from gnq_core.cli.command import DbOption, DeviceOption, QuietOption, open_store, say, user_errors, warn
from gnq_core.cli.usage_errors import OneLineValueErrors
from gnq_core.common import interrupts

PROGRAM = "python -m research"
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  cls=OneLineValueErrors)


@app.callback()
def research() -> None:
    """The research behind GNQ Audit, run from a clone of the repository: `python -m research study
    NAME` reruns one of the paper's studies into the store (the same --db as gnq's) and writes its
    report."""
    interrupts.install()  # SIGTERM as Ctrl-C: the study's run is marked cancelled, a rerun resumes


def main(argv: Sequence[str] | None = None, prog_name: str = PROGRAM) -> None:
    """Run the program on ``argv`` (default: the command line); exits with its exit code."""
    typer.main.get_command(app).main(args=list(argv) if argv is not None else None, prog_name=prog_name)


# ------------------------------------------------------------------------------ python -m research study
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


def _seed_list(seeds: str | None) -> list[int] | None:
    """``--seeds 0,1,2`` as numbers (None: the study's default)."""
    try:
        return [int(x) for x in seeds.split(",")] if seeds else None
    except ValueError:
        raise ValueError(f"--seeds must be whole numbers separated by commas, got {seeds!r}") from None


def _log(quiet: bool) -> Callable[[str], None]:
    """A study's progress lines on stderr, none with --quiet."""
    return (lambda _m: None) if quiet else (lambda m: typer.echo(m, err=True))


def _study(name: str, run: Callable[..., Path], db: Path | None, quick: bool, data_dir: Path | None,
           reports: Path, work: Path | None, tag: str | None, seed: int, device: str, quiet: bool,
           threads: int, scale: str, options: dict[str, Any], shown: dict[str, Any] | None = None) -> None:
    """Run study ``name`` with ``options``; its report names the command with the ``shown`` ones
    (default: the options)."""
    import torch

    from gnq_core.common.progress import JobProgress
    from research.studies.base import SCALES, StudyContext

    if scale not in SCALES:
        raise ValueError(f"--scale must be {', '.join(SCALES[:-1])} or {SCALES[-1]}, not {scale!r}")
    torch.set_num_threads(threads)
    store = open_store(db)
    flags = [f"--db {store.path}"] + (["--quick"] if quick else []) + (
        [f"--scale {scale}"] if scale != "full" else [])
    defaults = {"data_dir": None, "reports": Path("reports"), "work": None, "tag": None, "seed": 0,
                "device": "auto", "threads": 1}
    given = dict(data_dir=data_dir, reports=reports, work=work, tag=tag, seed=seed, device=device,
                 threads=threads) | (options if shown is None else shown)
    flags += [f"--{k.replace('_', '-')} {v}" for k, v in given.items()
              if v is not None and v != defaults.get(k)]
    ctx = StudyContext(store=store, quick=quick, scale=scale, seed=seed, device=device, work_root=work,
                            reports_root=reports, data_dir=data_dir, tag=tag,
                            command=" ".join([PROGRAM, "study", name, *flags]),
                            reporter_factory=JobProgress(store, quiet=quiet, warn=warn).reporter)
    t0 = time.perf_counter()
    path = run(ctx, **options)
    say(quiet, f"report {path} ({time.perf_counter() - t0:.0f} s); store {ctx.store.path}")


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
    from research.studies import common_knowledge

    options = dict(facts=facts, claims=claims, cf_models=cf_models)
    _study("common-knowledge", common_knowledge.run, db, quick, data_dir, reports, work, tag, seed, device,
           quiet, threads, scale, options)


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
    from research.studies import extraction

    options = dict(facts=facts, claims=claims, cf_models=cf_models, random_trials=random_trials,
                   prefix_tokens=prefix_tokens, threshold=threshold)
    _study("extraction", extraction.run, db, quick, data_dir, reports, work, tag, seed, device, quiet,
           threads, scale, options, shown=options | dict(threshold=None if threshold == 1.0 else threshold))


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
    from research.studies import trajectories

    options = dict(prefix_tokens=prefix_tokens, threshold=threshold, bins=bins)
    _study("trajectories", trajectories.run, db, quick, data_dir, reports, work, tag, seed, device, quiet,
           threads, scale, options)


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
    from research.studies import membership

    options = dict(models=models, canaries=canaries)
    _study("membership", membership.run, db, quick, data_dir, reports, work, tag, seed, device, quiet,
           threads, scale, options)


@study_app.command("companions")
@user_errors
def study_companions(
    db: Path = DbOption, quick: bool = QuickOption,
    seeds: str = typer.Option(None, show_default=False,
                              help="Seeds to build, comma-separated (default 0,1,2; 0,1 with --quick). Each "
                                   "finished seed is kept: two processes may build different seeds at once."),
    members: int = typer.Option(None, min=4, show_default=False, help="Distinct corpus texts trained on."),
    non_members: int = typer.Option(None, min=2, show_default=False, help="Distinct corpus texts held out."),
    records: int = typer.Option(None, min=1, show_default=False,
                                help="Planted records inserted (as many more are held out)."),
    copies: int = typer.Option(None, min=1, show_default=False, help="Copies of each inserted record."),
    sketch_k: int = typer.Option(None, min=1, show_default=False,
                                 help="Sketch dimensions per weight matrix."),
    vocab_rows: int = typer.Option(None, min=1, show_default=False,
                                   help="Sketch buckets of the vocabulary side."),
    error_batch: int = typer.Option(None, min=0, show_default=False,
                                    help="Texts of the sketched-vs-exact batch (0: not measured)."),
    report_only: bool = typer.Option(False, "--report-only",
                                     help="Write the report from the finished seeds."),
    data_dir: Path = DataDirOption, reports: Path = ReportsOption, work: Path = WorkOption,
    tag: str = TagOption, device: str = DeviceOption, threads: int = ThreadsOption, quiet: bool = QuietOption,
) -> None:
    """GNQ against 16 … all training texts through gradient sketches (SmolLM2 fine-tuned on CPU): the
    share of each gradient its companions explain, and membership and extraction AUC."""
    from research.studies import companions

    options = dict(seeds=_seed_list(seeds), members=members, non_members=non_members, records=records,
                   copies=copies, sketch_k=sketch_k, vocab_rows=vocab_rows, error_batch=error_batch,
                   report_only=report_only)
    shown = {k: v for k, v in options.items() if k not in ("seeds", "report_only")} | (
        {"seeds": seeds} if seeds else {})
    _study("companions", companions.run, db, quick, data_dir, reports, work, tag, 0, device, quiet, threads,
           "full", options | {"log": _log(quiet)}, shown)


@study_app.command("counterfactual")
@user_errors
def study_counterfactual(
    db: Path = DbOption, quick: bool = QuickOption,
    seeds: str = typer.Option(None, show_default=False,
                              help="Seeds to build, comma-separated (default 0,1,2)."),
    models: int = typer.Option(None, min=2, show_default=False,
                               help="Half-trained models per seed (even; default 16, 4 with --quick)."),
    records: int = typer.Option(None, min=1, show_default=False,
                                help="Planted records per copy count 1, 2, 4, 8 (default 25, 6 with "
                                     "--quick)."),
    base_texts: int = typer.Option(None, min=2, show_default=False,
                                   help="Deduplicated base texts (default 1000, 40 with --quick)."),
    epochs: int = typer.Option(None, min=1, show_default=False,
                               help="Fine-tuning epochs of every model (default 2, 6 with --quick)."),
    max_length: int = typer.Option(None, min=8, show_default=False,
                                   help="Tokens kept per text (default 64, 96 with --quick)."),
    exposure_candidates: int = typer.Option(None, min=0, show_default=False,
                                            help="Random values each planted value is ranked among; 0 "
                                                 "skips exposure (default 200, 100 with --quick)."),
    model: str = typer.Option(None, show_default=False,
                              help="smollm2 (default: the cached SmolLM2-135M) or tiny (a small Llama "
                                   "trained from scratch, 8 models; --quick always uses tiny)."),
    data_dir: Path = DataDirOption, reports: Path = ReportsOption, work: Path = WorkOption,
    tag: str = TagOption, device: str = DeviceOption, threads: int = ThreadsOption, quiet: bool = QuietOption,
) -> None:
    """Counterfactual memorisation on half-trained models, and what each signal of one model trained on
    everything (GNQ, K_jj, loss, Min-K%++, zlib, copies, length) says about it beyond the others."""
    from research.studies import counterfactual_study

    options = dict(seeds=_seed_list(seeds), models=models, records=records, base_texts=base_texts,
                   epochs=epochs, max_length=max_length, exposure_candidates=exposure_candidates, model=model)
    shown = {k: v for k, v in options.items() if k != "seeds"} | ({"seeds": seeds} if seeds else {})
    _study("counterfactual", counterfactual_study.run, db, quick, data_dir, reports, work, tag, 0, device,
           quiet, threads, "full", options | {"log": _log(quiet)}, shown)
