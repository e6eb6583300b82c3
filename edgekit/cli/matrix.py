"""`edgekit matrix SPEC.toml`: models × boards × precisions as independent cells (edgekit.matrix)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgekit.cli.common import CacheDirOpt, app, console, err, mb

COLOUR = {"pass": "green", "failed": "red", "error": "bold red", "refused": "yellow", "skipped": "dim"}


def _metric(c: dict) -> str:
    if c.get("accuracy_drop_points") is not None:
        return f"{c['accuracy_drop_points']:+.2f} pts"
    if c.get("top1_agreement") is not None:
        return f"agree {c['top1_agreement']:.1%}"
    return "—"


@app.command()
def matrix(
    spec: Annotated[Path, typer.Argument(help="the matrix spec (TOML): models, boards, precisions, per-cell overrides")],
    out: Annotated[Path, typer.Option("--output", "-o", help="builds/, logs/, matrix.json, matrix.html")] = Path(
        "build/matrix"),
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="cells at once on this machine "
                                             "(default: one per two cores)")] = None,
    ray: Annotated[str | None, typer.Option("--ray", help="run each cell as a task on a Ray cluster: auto, or its "
                                            "address host:port (needs edgekit[ray])")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild every cell even when the build cache holds "
                                           "it")] = False,
    cache_dir: CacheDirOpt = None,
) -> None:
    """Convert and verify every model for every board and precision of SPEC, each cell in its own process (or Ray
    task); a failed cell never stops the others; a cell whose inputs did not change comes from the build cache.
    Exit code 1 when a cell failed verification or hit an error."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from edgekit import matrix as mx

    lock = threading.Lock()
    running: set[str] = set()
    with Progress(TextColumn("[bold]cells[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=True) as prog:
        bar = prog.add_task("", total=None)

        def show() -> None:
            names = sorted(running)
            prog.update(bar, description=("running: " + ", ".join(names[:3]) + (" …" if len(names) > 3 else ""))
                        if names else "")

        def on_start(cell: dict) -> None:
            with lock:
                running.add(cell["id"])
                show()

        def on_done(cell: dict, res: dict) -> None:
            with lock:
                running.discard(cell["id"])
                prog.advance(bar)
                s = res["status"]
                hit = " (cached)" if res.get("cache_hit") else ""
                prog.console.print(f"[{COLOUR[s]}]{s:8}[/] {cell['id']:40} {res.get('seconds', 0):6.1f} s{hit}  "
                                   f"{(res.get('reason') or '')[:100]}", highlight=False)
                show()

        res = mx.run(spec, out, jobs=jobs, ray=ray, cache=not no_cache, cache_dir=cache_dir, on_start=on_start,
                     on_done=on_done)
    t = Table(title=f"matrix: {len(res['cells'])} cells, {res['runner']}, {res['wall_s']:.1f} s", title_justify="left")
    for col in ("model", "board", "precision", "status", "accuracy", "size", "est. latency"):
        t.add_column(col, overflow="fold", min_width=8 if col == "board" else None)
    for c in res["cells"]:
        est = c.get("estimated_latency_ms")
        t.add_row(c["model"], f"{c['board']} ({c['target']})", c["precision"], f"[{COLOUR[c['status']]}]{c['status']}[/]",
                  _metric(c), mb(c["artifact_bytes"]) if c.get("artifact_bytes") else "—",
                  "—" if est is None else f"{est:.3g} ms")
    console.print(t)
    for c in res["cells"]:
        if c["status"] != "pass":
            console.print(f"[{COLOUR[c['status']]}]{c['status']}[/] {c['id']}: {c.get('reason') or ''}", highlight=False)
    for w in res.get("warnings", []):
        err.print(f"[yellow]warning:[/] {w}")
    tot = res["totals"]
    hits = sum(bool(c.get("cache_hit")) for c in res["cells"])
    console.print(", ".join(f"{s} {n}" for s, n in tot.items() if n) + f" ({hits} from the build cache); "
                  f"report: {out / 'matrix.html'}, logs: {out / 'logs'}")
    if any(tot[s] for s in mx.FAILING):
        raise typer.Exit(1)
