"""`edgekit bundle`, `flash`, `smoke`, `results` (registered on the app when imported)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from edgekit.cli.common import app, console, err, fit, mb
from edgekit.errors import EdgekitError

DbOpt = Annotated[Path | None, typer.Option("--results-db", help="results SQLite file (default: user data dir; env EDGEKIT_RESULTS_DB)")]
HostOpt = Annotated[str | None, typer.Option("--host", help="user@addr[:port] (ssh), adb[:SERIAL], or local (default for board host/host)")]
KeyOpt = Annotated[Path | None, typer.Option("--key", help="SSH private key file")]
KnownOpt = Annotated[Path | None, typer.Option("--known-hosts", help="known_hosts file (default ~/.ssh/known_hosts)")]
AcceptOpt = Annotated[bool, typer.Option("--accept-new-host-key", help="trust and record an unknown host key (a changed key is always refused)")]
DestOpt = Annotated[str | None, typer.Option("--dest", help="bundle folder on the board (default ~/edgekit/<bundle name>)")]
MaxBundleOpt = Annotated[float | None, typer.Option("--max-bundle-mb", help="largest unpacked bundle to accept, MiB (default 1024; env EDGEKIT_MAX_BUNDLE_MB)")]
AdbOpt = Annotated[str | None, typer.Option("--adb-server", help="adb server host:port (default 127.0.0.1:5037)")]


def _record(kind: str, **fields: Any) -> None:
    from edgekit import results

    import sqlite3

    try:
        results.record(kind, **fields)
    except (OSError, sqlite3.Error) as exc:  # a locked or full db must not fail a flash that already succeeded
        err.print(f"[yellow]warning:[/] results store not updated ({exc})")


def _transport(man, host: str | None, key, known_hosts, accept: bool, adb_server: str | None):
    from edgekit.smoke import HOST_BOARD
    from edgekit.transports import open_transport

    if host is None:
        if man.board.id != HOST_BOARD:
            raise EdgekitError(f"this bundle is for board {man.board.id}: give --host user@addr[:port] (or adb[:SERIAL])")
        host = "local"
    return open_transport(host, key=str(key) if key else None, known_hosts=str(known_hosts) if known_hosts else None,
                          accept_new_host_key=accept, adb_server=adb_server)


@app.command()
def bundle(
    build_dir: Annotated[Path, typer.Argument(help="folder written by `edgekit convert -o`")],
    out: Annotated[Path | None, typer.Option("--output", "-o", help="bundle file (default <name>.tar.gz)")] = None,
    results_db: DbOpt = None,
) -> None:
    """Pack a verified build into one flashable .tar.gz (refuses a build that failed verification)."""
    from edgekit import results
    from edgekit.bundle import make_bundle, read_manifest

    results.use_db(results_db)
    out = out or Path(f"{read_manifest(build_dir).name}.tar.gz")
    path, man = make_bundle(build_dir, out)
    _record("bundle", **results.manifest_fields(man), path=str(path), bytes=path.stat().st_size, files=len(man.files))
    n = len(man.files)  # the files the manifest lists and hashes (what the smoke test's integrity check counts)
    console.print(f"[bold green]bundle[/] {path} ({mb(path.stat().st_size)}: {n} file{'s' if n != 1 else ''} + "
                  f"manifest.json, board {man.board.id}, {man.precision})")


@app.command()
def flash(
    bundle: Annotated[Path, typer.Argument(help="bundle .tar.gz (or a build folder)")],
    board: Annotated[str | None, typer.Option("--board", "-b", help="board profile the bundle must be built for")] = None,
    host: HostOpt = None,
    key: KeyOpt = None,
    known_hosts: KnownOpt = None,
    accept_new_host_key: AcceptOpt = False,
    dest: DestOpt = None,
    adb_server: AdbOpt = None,
    results_db: DbOpt = None,
    max_bundle_mb: MaxBundleOpt = None,
) -> None:
    """Upload BUNDLE to a staging folder on the board, verify every sha256 there, rename into place (resumable)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from edgekit import results
    from edgekit.bundle import unpack
    from edgekit.flash import flash as run_flash

    results.use_db(results_db)
    with unpack(bundle, max_mb=max_bundle_mb) as ub:  # unpacked and hashed once: the manifest and the files to send
        man = ub.manifest
        if board:
            from edgekit.profiles import load_board

            want = load_board(board).id
            if want != man.board.id:
                raise EdgekitError(f"{bundle} was built for board {man.board.id}, not {want}; "
                                   f"convert again with --board {want}")
        with _transport(man, host, key, known_hosts, accept_new_host_key, adb_server) as tr, Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err,
            transient=False,
        ) as prog:
            def on_file(rel: str, size: int):
                task = prog.add_task(rel, total=size)
                return lambda done: prog.update(task, completed=done)

            res = run_flash(ub, tr, dest=dest, on_file=on_file, log=lambda m: err.print(f"  [dim]{m}[/]"))
            where = tr.describe()
    _record("flash", **results.manifest_fields(man), host=where, **res.record_fields())
    state = "already installed" if res.already_installed else f"{len(res.uploaded)} sent, {len(res.skipped)} already there"
    console.print(f"[bold green]flashed[/] {man.name} → {where}:{res.dest} ({state}; every sha256 verified on the "
                  f"board; {res.seconds:.2f} s)", soft_wrap=True)  # a path in it: the terminal wraps it, rich does not cut it


@app.command()
def smoke(
    bundle: Annotated[Path, typer.Argument(help="bundle .tar.gz (or a build folder) already flashed")],
    host: HostOpt = None,
    key: KeyOpt = None,
    known_hosts: KnownOpt = None,
    accept_new_host_key: AcceptOpt = False,
    dest: DestOpt = None,
    python: Annotated[str | None, typer.Option("--python", help="python on the board (default: manifest's, else python3)")] = None,
    runtime: Annotated[str | None, typer.Option("--runtime", help="runner runtime (default: onnxruntime on the host board)")] = None,
    adb_server: AdbOpt = None,
    results_db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print smoke_result.json")] = False,
    max_bundle_mb: MaxBundleOpt = None,
) -> None:
    """Run the bundle's smoke test on the board, stream its log, print pass/fail per check."""
    from edgekit import results
    from edgekit.bundle import unpack
    from edgekit.smoke import smoke as run_smoke

    results.use_db(results_db)
    with unpack(bundle, max_mb=max_bundle_mb) as ub:  # unpacked and hashed once, for the manifest and the smoke run
        man = ub.manifest
        with _transport(man, host, key, known_hosts, accept_new_host_key, adb_server) as tr:
            res = run_smoke(ub, tr, dest=dest, python=python, runtime=runtime,
                            on_line=None if as_json else (lambda ln: err.print(f"  │ {ln}", markup=False,
                                                                             highlight=False)))
            where = tr.describe()
    r = res.result
    _record("smoke", **results.manifest_fields(man), host=where, **res.record_fields())
    if as_json:
        print(json.dumps(r, indent=2))
    else:
        t = Table(title=f"smoke test on {where} ({r.get('runtime', '?')})", title_justify="left")
        t.add_column("check")
        t.add_column("result")
        t.add_column("detail")
        for c in res.checks:
            mark = {True: "[green]pass[/]", False: "[red]FAIL[/]"}.get(c.get("passed"), "[dim]not measured[/]")
            t.add_row(c["name"], mark, str(c.get("detail", "")))
        console.print(t)
        console.print(("[bold green]PASSED[/]" if res.passed else "[bold red]FAILED[/]") + f" in {res.seconds:.2f} s")
    if not res.passed:
        raise typer.Exit(1)


@app.command("results")
def results_cmd(
    kind: Annotated[str | None, typer.Option("--kind", help="convert | bundle | flash | smoke | matrix")] = None,
    board: Annotated[str | None, typer.Option("--board", "-b", help="only this board id")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="newest N (0 = all)")] = 50,
    results_db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="add the bundle name and model hash columns")] = False,
) -> None:
    """List recorded converts, bundles, flashes and smoke tests (newest first; fits 80 columns, --wide for all)."""
    from edgekit import results

    results.use_db(results_db)
    rows = results.events(kind, board, limit or None)
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    def table(when: bool) -> Table:
        t = Table()  # the store's path goes on a line of its own: a table wraps its title to the table's width
        cols = ["id", *(["when (UTC)"] if when else []), "kind", "board", *(["bundle"] if wide else []), "precision",
                *(["model"] if wide else []), "est. ms", "meas. ms", "result"]
        for col in cols:  # short cells never wrap or truncate; the figures' headers may wrap between words
            t.add_column(col, no_wrap=col not in ("board", "bundle", "est. ms", "meas. ms"), overflow="fold",
                         justify="right" if "ms" in col else "left")
        for e in rows:
            fmt = lambda v: "—" if v is None else f"{v:.3g}"
            res = {True: "[green]pass[/]", False: "[red]fail[/]"}.get(e.get("passed"), "")
            stamp = e["at_utc"] if wide else e["at_utc"][5:16].replace("T", " ")  # MM-DD HH:MM
            t.add_row(str(e["id"]), *([stamp] if when else []), e["kind"], e.get("board_id") or "",
                      *([e.get("bundle") or ""] if wide else []), e.get("precision") or "",
                      *([(e.get("model_sha256") or "")[:12]] if wide else []),
                      fmt(e.get("estimated_latency_ms")), fmt(e.get("measured_latency_ms")), res)
        return t

    t = table(when=True)
    if not fit(t) and not wide:  # at 80 columns the time goes first: whole board ids matter more (--json has it)
        fit(t := table(when=False))
    console.print(f"results: {results.db_path()}", highlight=False)
    console.print(t)
