"""What every command module shares: the typer app, the consoles, common options."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from edgekit.quiet import terminal
from edgekit.report_md import fmt_size as mb  # noqa: F401 - the one size format, for the command modules

app = typer.Typer(
    name="edgekit",
    help="Ship a trained model to an edge board: convert, verify, bundle, flash, smoke-test.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
def _version(value: bool) -> None:
    if value:
        from edgekit import __version__

        print(__version__)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the edgekit version and exit")] = False,
) -> None:
    """Ship a trained model to an edge board: convert, verify, bundle, flash, smoke-test."""


boards_app = typer.Typer(help="List board profiles, or show one (`edgekit boards show NAME`).", invoke_without_command=True)
app.add_typer(boards_app, name="boards")

console = Console()
err = Console(file=terminal)  # stderr; edgekit's own lines stay on screen while toolchain output is captured

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a board field: key=value (dotted for tables)")]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-shape", help="input shape, e.g. 1,3,224,224 or name:1,3,224,224 (repeat per input)"),
]

ConstOpt = Annotated[
    list[str] | None,
    typer.Option("--const", help="ONNX: fold an input into the graph as a constant, e.g. sr=16000 (repeat per input)"),
]

CacheDirOpt = Annotated[
    str | None,
    typer.Option("--cache-dir", help="build cache folder (default $EDGEKIT_CACHE_DIR, else cache/ in edgekit's data folder)"),
]
