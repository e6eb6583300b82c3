"""`edgekit boards`, `edgekit targets`, `edgekit version`: the shipped profiles."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from edgekit.cli.common import SetOpt, app, boards_app, console, fit


@boards_app.callback()
def boards(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Option("--target", "-t", help="only boards for this target")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="add each board's description")] = False,
) -> None:
    """List the shipped board profiles (fits 80 columns; --wide adds descriptions)."""
    if ctx.invoked_subcommand is not None:
        return
    from edgekit.profiles import list_boards

    t = Table(title="boards", title_justify="left")
    t.add_column("board", no_wrap=True)
    t.add_column("targets")
    t.add_column("RAM", no_wrap=True, justify="right")
    t.add_column("precisions", overflow="fold")  # long lists wrap instead of squeezing other columns away
    t.add_column("power modes", overflow="fold")
    if wide:
        t.add_column("description", overflow="fold")
    for b in list_boards(target):
        row = [b.id, " ".join(b.targets), f"{b.ram_mb / 1024:g} GB", " ".join(b.precisions),
               " ".join(b.power_modes)]
        t.add_row(*row, *([b.description] if wide else []))
    fit(t)
    console.print(t)


@boards_app.command("show")
def boards_show(
    name: Annotated[str, typer.Argument(help="vendor/board or board")],
    board_set: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one board profile (with --set overrides applied and validated)."""
    from edgekit.profiles import load_board

    b = load_board(name, board_set)
    data = b.model_dump(mode="json")
    if as_json:
        print(json.dumps(data, indent=2))
        return
    console.print(f"[bold]{b.id}[/]: {b.description}")
    for k in ("targets", "ram_mb", "storage_mb", "memory_bandwidth_gbps", "runtime_overhead_mb", "default_power_mode"):
        console.print(f"  {k} = {data[k]}")
    t = Table(title="power modes (dense peak)", title_justify="left")
    t.add_column("mode")
    t.add_column("power_w", justify="right")
    for p in b.precisions:
        t.add_column(f"{p} TOPS", justify="right")
    for name_, pm in b.power_modes.items():
        t.add_row(name_, f"{pm.power_w:g}", *[f"{pm.peak_tops.get(p, 0):g}" for p in b.precisions])
    console.print(t)
    console.print("  budgets: " + ", ".join(f"{k}={v}" for k, v in data["budgets"].items() if v is not None))
    if b.notes:
        for n in b.notes:
            console.print(f"  note: {n}")


@app.command()
def targets() -> None:
    """List the output targets."""
    from edgekit.profiles import list_targets

    t = Table(title="targets", title_justify="left")
    for col in ("target", "format", "precisions", "extra", "description"):
        t.add_column(col)
    for tg in list_targets():
        t.add_row(tg.name, tg.format, ",".join(tg.precisions), escape(f"edgekit[{tg.extra}]"), tg.description)
    console.print(t)


@app.command()
def version() -> None:
    """Print the edgekit version."""
    from edgekit import __version__

    print(__version__)


@app.command("manifest-schema")
def manifest_schema() -> None:
    """Print the JSON Schema of a build's manifest.json (what bundle, flash and smoke accept)."""
    from edgekit.manifest import schema

    print(json.dumps(schema(), indent=2))
