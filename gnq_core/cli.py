"""The ``gnq`` command."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="GNQ Audit: which training texts has your model encoded? (gradient uniqueness)",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()


@app.callback()
def main() -> None:
    """GNQ Audit command line."""


@app.command()
def selfcheck(
    seed: int = typer.Option(None, help="Random seed (default: a fresh one each run)."),
    lam: float = typer.Option(1e-3, help="λ used for the check."),
) -> None:
    """Check the engine: exact GNQ vs explicit per-example gradients on small models."""
    from .selfcheck import TOLERANCE, run_selfcheck

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
    console.print("All checks passed. The dashboard arrives with the next release; "
                  "see README.md for the Python API.")
