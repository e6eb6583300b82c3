"""What every command module shares: the typer app, the consoles, common options."""

from __future__ import annotations

from typing import Annotated

import typer
import typer.core
from rich.console import Console
from rich.table import Table

from edgekit.quiet import terminal
from edgekit.units import fmt_bytes as mb  # noqa: F401 - the one size format, for the command modules

# typer writes a type beside every option, `<bool>` beside a flag too, where it only takes help room: a flag takes
# no value, so nothing is shown. A typer without this method keeps its own display (help stays correct).
_display_type = getattr(typer.core.TyperOption, "display_type_rich", None)
if _display_type is not None:
    typer.core.TyperOption.display_type_rich = lambda self, ctx: None if self.is_flag else _display_type(self, ctx)

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

BatchAxisOpt = Annotated[
    list[str] | None,
    typer.Option("--batch-axis", help="the axis of an input or output that holds the batch, where not 0: "
                 "NAME=AXIS, e.g. state=1 for a recurrent state [layers, B, H], or NAME=none (repeat per tensor)"),
]

CarryOpt = Annotated[
    list[str] | None,
    typer.Option("--carry", help="OUTPUT=INPUT: the output that feeds the input on the next chunk, e.g. "
                 "state_out=state (a recurrent state; the data files' chunks are then in time order and need no "
                 "array for the input); repeat per state"),
]

SequenceLengthOpt = Annotated[
    int | None,
    typer.Option("--sequence-length", help="with --carry: chunks per sequence in the data files (each starts "
                 "from a zero state; default: each file is one sequence)"),
]

CacheDirOpt = Annotated[
    str | None,
    typer.Option("--cache-dir", help="build cache folder (default $EDGEKIT_CACHE_DIR, else cache/ in edgekit's data folder)"),
]


def fit(t: Table, con: Console | None = None) -> bool:
    """``t`` laid out for this terminal with no word broken: each wrapping column at least as wide as its longest
    word (a board id, ``int8-dynamic``), the room left shared by how much more each would take; where even that
    is wider than the terminal, the same table with a header rule only (no column rules, edges or doubled padding).
    rich's own layout squeezes the widest columns first and may break a word or crop every line. False where the
    table cannot fit whole words: the caller then drops columns or stacks cells."""
    from rich import box
    from rich.cells import cell_len
    from rich.text import Text

    con = con or console

    def plain(cell: object) -> str:
        return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain

    least, rows, most = [], [], []  # per column: whole words; every row on one line; the header on one line too
    for col in t.columns:
        lines = [ln for cell in col.cells for ln in plain(cell).splitlines()]
        words = max((cell_len(w) for ln in [*lines, plain(col.header)] for w in ln.split()), default=1)
        longest = max(words, *(cell_len(ln) for ln in lines))
        least.append(longest if col.no_wrap else max(words, col.min_width or 0))
        rows.append(longest)
        most.append(max(longest, cell_len(plain(col.header))))
    n = len(t.columns)
    room = con.width - (3 * n + 1)  # rules and padding of the boxed table
    compact = con.width - (2 * n - 2)
    if sum(least) > room or sum(rows) > room >= sum(rows) - (compact - room):  # or rows on one line without rules
        t.box, t.show_edge, t.pad_edge, t.collapse_padding = box.SIMPLE_HEAD, False, False, True
        room = compact
    if sum(least) > room:
        return False
    widths = list(least)
    for goal in (rows, most):  # explicit widths: rich would size a column by its whole header first
        spare, want = room - sum(widths), [g - w for w, g in zip(widths, goal)]
        widths = [w + min(d, spare * d // max(sum(want), 1)) for w, d in zip(widths, want)]
    for col, w in zip(t.columns, widths):
        col.width = w
    return True
