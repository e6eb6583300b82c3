"""The edgekit command line: a thin typer layer over the Python API.

Nothing heavy is imported at module level: `edgekit --help` and `edgekit boards` work
without torch, onnx or onnxruntime installed. User errors (EdgekitError) print one line
and exit 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgekit.errors import EdgekitError

app = typer.Typer(
    name="edgekit",
    help="Ship a trained model to an edge board: convert, verify, bundle, flash, smoke-test.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
boards_app = typer.Typer(help="List board profiles, or show one (`edgekit boards show NAME`).", invoke_without_command=True)
app.add_typer(boards_app, name="boards")

console = Console()
err = Console(stderr=True)

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a board field: key=value (dotted for tables)")]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-shape", help="input shape, e.g. 1,3,224,224 or name:1,3,224,224 (repeat per input)"),
]


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


@app.command()
def convert(
    model: Annotated[str, typer.Argument(help="model file (.pt2, .pt, .onnx, .keras, .h5), SavedModel folder, or pkg.module:factory")],
    target: Annotated[str, typer.Option("--target", "-t", help="output target, see `edgekit targets`")] = "jetson",
    out: Annotated[Path, typer.Option("--output", "-o", help="output folder (replaced atomically)")] = Path("build"),
    board: Annotated[str | None, typer.Option("--board", "-b", help="board profile, see `edgekit boards`")] = None,
    precision: Annotated[str, typer.Option("--precision", "-p", help="auto (the planner picks from the board's budgets) | fp32 | fp16 | int8 | ... (see `edgekit targets`)")] = "auto",
    calib: Annotated[str | None, typer.Option("--calib", help="calibration .npz, or 'random' (accuracy then unknown)")] = None,
    eval_data: Annotated[str | None, typer.Option("--eval", help="eval .npz with inputs and 'label': float vs converted accuracy")] = None,
    input_shape: ShapeOpt = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle", help="allow torch.load of a pickled module (runs code from the file)")] = False,
    board_set: SetOpt = None,
    opset: Annotated[int | None, typer.Option("--opset", help="ONNX opset (default: the target's)")] = None,
    golden: Annotated[int, typer.Option("--golden", help="number of golden samples")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="print the manifest as JSON")] = False,
    option: Annotated[list[str] | None, typer.Option("--option", help="converter option key=value, e.g. layout=nhwc, allow_float_fallback=true (android)")] = None,
    max_data_mb: Annotated[float | None, typer.Option("--max-data-mb", help="largest --calib/--eval arrays to load, MB (default 1024; env EDGEKIT_MAX_DATA_MB)")] = None,
) -> None:
    """Convert MODEL for a target board and verify it on the host against the float model."""
    from edgekit.pipeline import convert as run_convert
    from edgekit.profiles import parse_overrides

    status = err.status("starting…")
    status.start()

    def on_stage(name: str, msg: str) -> None:
        if msg == "start":
            status.update(f"[bold]{name}[/]…")
        else:
            err.print(f"[green]✓[/] {name:<8} {msg}")

    try:
        res = run_convert(
            model, target=target, out=out, board=board, precision=precision, calib=calib, eval_data=eval_data,
            input_shape=input_shape, trust_pickle=trust_pickle, board_set=board_set, opset=opset,
            golden_count=golden, options=parse_overrides(option, "--option", "allow_float_fallback=true") or None,
            max_data_mb=max_data_mb, log=lambda m: err.print(f"  [dim]{m}[/]"),
            warn=lambda m: err.print(f"[yellow]warning:[/] {m}"), on_stage=on_stage,
        )
    finally:
        status.stop()
    man = res.manifest
    if as_json:
        print(json.dumps(man, indent=2))
        return
    v = res.verification
    t = Table(title=f"host verification: {v.runtime}, {v.golden_samples} golden samples", title_justify="left")
    for col in ("output", "max abs err", "rel err", "tolerance", "top-1 agree", "result"):
        t.add_column(col)
    for o in v.outputs:
        t.add_row(o.name, f"{o.max_abs_error:.4g}", f"{o.max_rel_error:.3%}", f"{o.tolerance_rel:.2%}",
                  "—" if o.top1_agreement is None else f"{o.top1_agreement:.1%}",
                  "[green]pass[/]" if o.passed else "[red]FAIL[/]")
    console.print(t)
    if v.float_accuracy is not None:
        console.print(f"accuracy ({v.eval_samples} samples): float {v.float_accuracy:.2%} → "
                      f"{man['precision']} {v.converted_accuracy:.2%}")
    prim = man["artifact"]["primary"]
    # the primary artifact may be a folder (a Core ML .mlpackage): sum its files
    prim_bytes = sum(f["bytes"] for k, f in man["files"].items() if k == prim or k.startswith(prim + "/"))
    console.print(f"[bold green]converted[/] {man['source_model']['path']} → {res.out_dir / prim} "
                  f"({_mb(prim_bytes)}, {man['precision']}, board {man['board']['id']})")
    for n in res.notes:
        console.print(f"[dim]note: {n}[/]")
    console.print(f"report: {res.out_dir / 'report.md'}   board smoke test: python3 run.py (in the bundle)")


@app.command()
def inspect(
    model: Annotated[str, typer.Argument(help="model file (.pt2, .pt, .onnx, .keras, .h5), SavedModel folder, or pkg.module:factory")],
    target: Annotated[str | None, typer.Option("--target", "-t", help="also check ops against this target")] = None,
    input_shape: ShapeOpt = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    top: Annotated[int, typer.Option("--top", help="rows in the per-layer table (0 = all)")] = 0,
) -> None:
    """Parameters, MACs, weight bytes per precision, peak live activations, per-layer table."""
    from edgekit.analyze import analyze_model
    from edgekit.fsutil import work_dir
    from edgekit.ingest import check_target_takes, load_model
    from edgekit.profiles import load_target

    tgt = load_target(target) if target else None
    check_target_takes(model, tgt)
    m = load_model(model, input_shape, trust_pickle)
    with work_dir("edgekit-") as tmp:
        # the same analysis as convert's analyze stage (ONNX graph; fp32 .tflite for Keras / SavedModel)
        stats, _ = analyze_model(m, Path(tmp), tgt)
    if as_json:
        out = stats.to_json()
        out["model"] = {"source": m.source, "kind": m.kind, "sha256": m.sha256,
                        "inputs": [s.to_json() for s in m.inputs], "outputs": [s.to_json() for s in m.outputs]}
        print(json.dumps(out, indent=2))
    else:
        t = Table(title=f"{m.source} ({m.kind})", title_justify="left")
        for col, just in (("#", "right"), ("layer", "left"), ("op", "left"), ("params", "right"),
                          ("MACs", "right"), ("output", "left"), ("act. bytes", "right")):
            t.add_column(col, justify=just)
        rows = stats.layers if not top else sorted(stats.layers, key=lambda x: -x.macs)[:top]
        for i, lay in enumerate(rows):
            t.add_row(str(i), lay.name, lay.op, f"{lay.params:,}", f"{lay.macs:,}", str(lay.output_shape),
                      f"{lay.activation_bytes:,}")
        console.print(t)
        console.print(f"inputs: {', '.join(f'{s.name} {list(s.shape)} {s.dtype}' + (f' {s.layout.upper()}' if s.layout else '') for s in m.inputs)}")
        console.print(f"parameters: {stats.params:,}   MACs: {stats.macs:,}")
        console.print("weight bytes: " + "   ".join(f"{k} {_mb(b)}" for k, b in stats.weight_bytes.items()))
        console.print(f"peak live activations: {_mb(stats.peak_activation_bytes)} "
                      f"(all activations summed: {_mb(stats.total_activation_bytes)})")
        console.print("ops: " + ", ".join(f"{k}×{n}" for k, n in stats.ops.items()))
        if tgt is not None:
            if stats.unsupported:
                console.print(f"[red]{len(stats.unsupported)} op(s) target {tgt.name} cannot run:[/]")
                for u in stats.unsupported:
                    console.print(f"  {u['op']}  (node {u['node']})")
            else:
                console.print(f"[green]every op is supported by target {tgt.name}[/]")
    if tgt is not None and stats.unsupported:
        raise typer.Exit(1)


@boards_app.callback()
def boards(
    ctx: typer.Context,
    target: Annotated[str | None, typer.Option("--target", "-t", help="only boards for this target")] = None,
) -> None:
    """List the shipped board profiles."""
    if ctx.invoked_subcommand is not None:
        return
    from edgekit.profiles import list_boards

    t = Table(title="boards", title_justify="left")
    t.add_column("board", no_wrap=True)
    for col in ("targets", "RAM", "precisions", "power modes"):
        t.add_column(col)
    t.add_column("description", overflow="ellipsis", no_wrap=True, max_width=60)
    for b in list_boards(target):
        t.add_row(b.id, ",".join(b.targets), f"{b.ram_mb / 1024:g} GB", ",".join(b.precisions),
                  ",".join(b.power_modes), b.description)
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
        t.add_row(tg.name, tg.format, ",".join(tg.precisions), f"edgekit[{tg.extra}]", tg.description)
    console.print(t)


@app.command()
def version() -> None:
    """Print the edgekit version."""
    from edgekit import __version__

    print(__version__)


# Commands defined in other modules register themselves on `app` when imported here.
# Keep those modules light at import time (no torch/onnx/etc. at module level).
# (one import line per module, e.g. `from edgekit import cli_flash  # noqa: E402,F401`)
from edgekit import cli_flash  # noqa: E402,F401
from edgekit import cli_plan  # noqa: E402,F401


# the machine's state, not edgekit's or the user's input: one line, exit 2, no traceback
_ENV_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EROFS: "the file system is read-only",
               errno.EDQUOT: "disk quota exceeded", errno.EACCES: "permission denied", errno.EPERM: "not permitted"}


def _stop(signum: int, _frame: object) -> None:
    """SIGINT, SIGTERM and SIGHUP unwind: every temporary folder and staging sibling is removed on the way out.
    The signal is remembered too (fsutil.check_stop), in case a toolchain swallows the exception."""
    from edgekit import fsutil

    fsutil.stop_signal = signum
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def main() -> None:
    from edgekit import fsutil

    fsutil.notice = lambda m: err.print(f"[dim]note: {m}[/]", highlight=False, soft_wrap=True)
    # Ctrl-C unwinds too, even where the shell started edgekit with SIGINT ignored (a background job)
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, _stop)
    try:
        app()  # click's standalone mode handles usage errors (exit 2) and Ctrl-C ("Aborted!", exit 1)
    except SystemExit as exc:
        if fsutil.stop_signal is not None and not exc.code:  # a toolchain swallowed the signal: still stopped
            sys.exit(128 + fsutil.stop_signal)
        raise
    except EdgekitError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in _ENV_ERRNOS:
            raise
        name = exc.filename2 or exc.filename  # a copy reports (source, destination): the destination is full
        where = f"{name}: " if name else ""
        err.print(f"[bold red]error:[/] {where}{_ENV_ERRNOS[exc.errno]}; free space, fix the permissions, or choose "
                  "another folder (-o, TMPDIR)", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
