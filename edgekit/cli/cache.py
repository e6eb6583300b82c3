"""`edgekit cache ls|prune`: the build cache (edgekit.cache)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgekit.cli.common import CacheDirOpt, app, console, fit, mb

cache_app = typer.Typer(help="The build cache: verified builds by the hash of their inputs (`ls`, `prune`).",
                        no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("ls")
def ls(cache_dir: CacheDirOpt = None) -> None:
    """List the cache's entries, least recently used first."""
    from edgekit.cache import age, cache_root, entries

    found = entries(cache_dir)
    root = cache_root(cache_dir)
    if not found:
        console.print(f"the build cache in {root} is empty")
        return
    def table(stacked: bool) -> Table:
        t = Table(title=f"build cache: {root}", title_justify="left")
        cols = (("key", "left"), ("kind", "left"), ("model", "left"),
                *((("build", "left"),) if stacked else (("target", "left"), ("board", "left"), ("precision", "left"))),
                ("size", "right"), ("built", "right"))
        for col, just in cols:
            t.add_column(col, justify=just, no_wrap=col in ("key", "size"))
        for e in found:
            what = [f"{e.target} {e.precision or ''}".strip() + f"\n{e.board}" if e.board else e.target] if stacked \
                else [e.target, e.board or "—", e.precision or "—"]
            t.add_row(e.key[:12], e.kind, Path(e.model).name if stacked else e.model,
                      *what, mb(e.bytes), f"{age(e.built_utc)} ago")
        return t

    t = table(stacked=False)
    if not fit(t):  # narrow terminal: target, precision and board in one cell, the model's file name
        fit(t := table(stacked=True))
    console.print(t)
    console.print(f"{len(found)} entries, {mb(sum(e.bytes for e in found))}")


@cache_app.command("prune")
def prune(
    max_gb: Annotated[float, typer.Option("--max-gb", help="keep at most this many GB (0 empties the cache)")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Remove the least recently used entries until the cache holds at most --max-gb GB."""
    from edgekit.cache import cache_root, prune as run_prune

    removed, left = run_prune(max_gb, cache_dir)
    console.print(f"removed {len(removed)} entries ({mb(sum(e.bytes for e in removed))}) from "
                  f"{cache_root(cache_dir)}; {mb(left)} left")
