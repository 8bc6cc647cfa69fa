"""What every ``gnq`` command shares: the Typer app and its callback, the common options, the
one-line handling of user errors, the store, and running a job with progress."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from gnq_core.cli.usage_errors import OneLineValueErrors, fail
from gnq_core.common import interrupts
from gnq_core.common.terminal import encodable_streams, markup_safe, terminal_safe

# The options' defaults are the settings types' (pipelines/settings.py: light, no torch).
from gnq_core.pipelines.settings import AuditSettings, JobSettings

interrupts.quiet_interrupt_at_exit()  # Ctrl-C before a command starts: one line, no traceback
encodable_streams()  # the C locale's ASCII: "×" in a message is escaped, not a crash

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
DeviceOption = typer.Option(AuditSettings.device, help="auto, cpu or cuda.")
CpuThreadsOption = typer.Option(None, "--threads", min=1,
                                help="torch CPU threads (default: torch's choice). Use 1 when other jobs "
                                     "share the cores: competing OpenMP threads can slow a step 10x.")
TextColumnOption = typer.Option(None, help="Column holding the text (default: 'text').")
DataFormatOption = typer.Option("auto", "--data-format",
                                help="auto, text, messages, sharegpt, prompt-completion or alpaca: chat "
                                     "records are rendered with the checkpoint's chat template (the base "
                                     "model's for adapters) as TRL's SFTTrainer renders them; auto reads "
                                     "the columns and says what it found.")
TrainOnOption = typer.Option(None, "--train-on", show_default=False,
                             help="Chat data: the tokens the fine-tune was trained on, all, assistant or "
                                  "completion (default: TRL's for the format: all for messages/ShareGPT, "
                                  "completion for prompt-completion/Alpaca). Losses and GNQ are over them.")
GroupColumnOption = typer.Option(None, help="Column with a group label (default: 'group' if present).")
SecretColumnOption = typer.Option(None, "--secret-column", show_default=False,
                                  help="Column holding each row's private value(s) (';'-separated, or a "
                                       "list): found in its text and attacked like any secret-like value.")
SecretPatternOption = typer.Option(None, "--secret-pattern", show_default=False,
                                   help="A regular expression of values to treat as secret (repeatable); "
                                        "its group named 'value', else its first group, else the whole match,"
                                        " is the value; a group named 'free' marks the characters that vary "
                                        "(exposure ranks the value among those, the rest kept).")
PublicColumnOption = typer.Option(None, "--public-column", show_default=False,
                                  help="Column marking public texts (true/false, yes/no, 1/0): not searched "
                                       "for secrets, never 'at risk'.")
MaxLengthOption = typer.Option(AuditSettings.max_length, help="Tokens per example (longer texts are cut).")
LossOption = typer.Option(AuditSettings.loss, "--loss",
                          help="Per-example loss ℓ_j: token_mean (each text's mean next-token NLL) or "
                               "token_sum (its sum: longer texts weigh more).")
LamModeOption = typer.Option(AuditSettings.lam_mode, "--lam-mode",
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
            fail(one_line(exc))
        except KeyboardInterrupt:
            err_console.print("interrupted: finished checkpoints/epochs are saved; rerun the same command "
                              "to resume")
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def open_store(db: Path | None, *, create: bool = True):
    """The store; ``create=False`` (reading commands) refuses one that does not exist yet."""
    from gnq_core.results.store import Store

    store = Store(db, on_wait=warn)
    return store if create else store.require_existing()


def warn(message: str) -> None:
    err_console.print(terminal_safe(message), soft_wrap=True, highlight=False, markup=False)


def run_and_tell(settings: JobSettings, db: Path | None, quiet: bool) -> None:
    """Run the job (pipelines/run.py) with a progress bar unless ``quiet``; print what it says."""
    from gnq_core.common.progress import JobProgress
    from gnq_core.pipelines.run import run_job

    store = open_store(db)
    for line in run_job(settings, store, JobProgress(store, quiet=quiet, warn=warn)):
        say(quiet, line)


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


def say(quiet: bool, message: str) -> None:
    if not quiet:
        console.print(markup_safe(message), highlight=False)
