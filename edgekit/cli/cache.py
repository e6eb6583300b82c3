"""`edgekit cache ls|prune`: the build cache (edgekit.cache)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from edgekit.cli.common import CacheDirOpt, app, console, mb

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
    t = Table(title=f"build cache: {root}", title_justify="left")
    for col, just in (("key", "left"), ("kind", "left"), ("model", "left"), ("target", "left"),
                      ("board", "left"), ("precision", "left"), ("size", "right"), ("built", "right")):
        t.add_column(col, justify=just)
    for e in found:
        t.add_row(e.key[:12], e.kind, e.model, e.target, e.board or "—", e.precision or "—", mb(e.bytes),
                  f"{age(e.built_utc)} ago")
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
