"""`edgekit fleet flash|smoke BUNDLE... --fleet fleet.toml`: many boards at once (edgekit.fleet)."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from edgekit.cli.common import app, console, err
from edgekit.cli.flash import DbOpt, MaxBundleOpt, _record

fleet_app = typer.Typer(help="Flash or smoke-test bundles on every matching board of a fleet.toml at once.",
                        no_args_is_help=True)
app.add_typer(fleet_app, name="fleet")

BundlesArg = Annotated[list[Path], typer.Argument(help="bundles (.tar.gz or build folders); each goes to the boards "
                                                       "of the profile it was built for")]
FleetOpt = Annotated[Path, typer.Option("--fleet", help="fleet.toml listing the boards (docs/flash.md, Fleet)")]
TagOpt = Annotated[list[str] | None, typer.Option("--tag", help="only boards with this tag (repeat: all of them)")]
ParOpt = Annotated[int, typer.Option("--max-parallel", help="boards worked on at once")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds one attempt on one board may take")]
RetriesOpt = Annotated[int, typer.Option("--retries", help="attempts after a failed one (a flash resumes)")]


class _Board:
    def __init__(self) -> None:
        self.state, self.detail, self.attempt, self.t0, self.result, self.secs = "waiting", "", 0, None, "", 0.0


def _run(action: str, bundles: list[Path], fleet_file: Path, tag: list[str] | None, max_parallel: int,
         timeout: float, retries: int, results_db: Path | None, max_bundle_mb: float | None) -> None:
    from edgekit import results
    from edgekit.bundle import unpack
    from edgekit.fleet import load_fleet, run_fleet

    results.use_db(results_db)
    fleet = load_fleet(fleet_file)
    lock = threading.Lock()
    rows = {b.name: _Board() for b in fleet.select(tag)}

    def table() -> Table:
        t = Table(title=f"fleet {action}: {fleet_file}", title_justify="left")
        for col in ("board", "profile", "state", "progress", "try", "s"):
            t.add_column(col, justify="right" if col in ("try", "s") else "left")
        with lock:
            for b in fleet.select(tag):
                r = rows[b.name]
                secs = "" if r.t0 is None else f"{r.secs if r.result else time.perf_counter() - r.t0:.1f}"
                t.add_row(b.name, b.board, r.result or r.state, r.detail, str(r.attempt or ""), secs)
        return t

    def on_event(name: str, what: str, detail: Any) -> None:
        with lock:
            r = rows[name]
            if what == "start":
                r.t0, r.state = time.perf_counter(), "connecting"
            elif what == "attempt":
                r.attempt, r.state, r.detail = detail, "connecting", ""
            elif what == "bundle":
                r.state = f"{action}ing {detail}"
            elif what == "done":
                r.secs = detail.seconds
                r.result = "[green]passed[/]" if detail.passed else "[red]FAILED[/]"
                r.detail = "" if detail.passed else escape((detail.reason or "")[:60])

    def on_file(name: str, rel: str, size: int):
        def progress(done: int) -> None:
            with lock:
                rows[name].detail = f"{rel} {done * 100 // max(size, 1)}%"
        return progress

    with ExitStack() as stack:
        unpacked = [stack.enter_context(unpack(b, max_mb=max_bundle_mb)) for b in bundles]
        with Live(table(), console=err, refresh_per_second=4, get_renderable=table, transient=True):
            outcomes = run_fleet(action, unpacked, fleet, tag, max_parallel, timeout, retries, on_event,
                                 on_file if action == "flash" else None)
        for o in outcomes:  # the results store, as `edgekit flash` / `smoke` record one board
            done = o.flashed or o.smoked
            for i, ub in enumerate(u for u in unpacked if u.manifest.board.id == o.board.board and not o.skipped):
                fields = done[i].record_fields() if i < len(done) else {"passed": False, "reason": o.reason}
                _record(action, **results.manifest_fields(ub.manifest), host=o.host or o.board.host(),
                        fleet_board=o.board.name, **fields)
    t = Table(title=f"fleet {action}: {sum(o.passed for o in outcomes)} of "
                    f"{sum(not o.skipped for o in outcomes)} boards passed", title_justify="left")
    for col in ("board", "address", "result", "tries", "s", "detail"):
        t.add_column(col, overflow="fold")
    for o in outcomes:
        res = "[dim]skipped[/]" if o.skipped else ("[green]passed[/]" if o.passed else "[red]FAILED[/]")
        detail = escape(o.reason or _detail(action, o))
        t.add_row(o.board.name, o.host or o.board.host(), res, str(o.attempts or ""),
                  f"{o.seconds:.1f}" if o.attempts else "", detail)
    console.print(t)
    if any(not o.passed and not o.skipped for o in outcomes):
        raise typer.Exit(1)


def _detail(action: str, o: Any) -> str:
    if action == "flash":
        return "; ".join("already installed" if f.already_installed else
                         f"{len(f.uploaded)} sent, {len(f.skipped)} already there" for f in o.flashed)
    return "; ".join(f"p50 {s.latency_p50_ms:.3g} ms" if s.latency_p50_ms is not None else "passed" for s in o.smoked)


@fleet_app.command("flash")
def fleet_flash(bundles: BundlesArg, fleet: FleetOpt, tag: TagOpt = None, max_parallel: ParOpt = 4,
                timeout: TimeoutOpt = 600, retries: RetriesOpt = 1, results_db: DbOpt = None,
                max_bundle_mb: MaxBundleOpt = None) -> None:
    """Flash BUNDLES onto every matching board at once: staged, verified by sha256 on each board, resumable."""
    _run("flash", bundles, fleet, tag, max_parallel, timeout, retries, results_db, max_bundle_mb)


@fleet_app.command("smoke")
def fleet_smoke(bundles: BundlesArg, fleet: FleetOpt, tag: TagOpt = None, max_parallel: ParOpt = 4,
                timeout: TimeoutOpt = 600, retries: RetriesOpt = 1, results_db: DbOpt = None,
                max_bundle_mb: MaxBundleOpt = None) -> None:
    """Run the flashed BUNDLES' smoke tests on every matching board at once; results go to the results store."""
    _run("smoke", bundles, fleet, tag, max_parallel, timeout, retries, results_db, max_bundle_mb)
