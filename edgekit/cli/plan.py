"""`edgekit plan` and `edgekit calibrate`: the budget-driven planner on the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgekit.cli.common import SetOpt, ShapeOpt, app, console, err, fit


def _num(v: float) -> str:
    return f"{v:.4g}"


@app.command()
def plan(
    model: Annotated[str, typer.Argument(help="model file (.pt2, .pt, .onnx) or pkg.module:factory")],
    board: Annotated[str, typer.Option("--board", "-b", help="board profile, see `edgekit boards`")],
    target: Annotated[str | None, typer.Option("--target", "-t", help="output target (default: the board's first)")] = None,
    max_ram_mb: Annotated[float | None, typer.Option("--max-ram-mb", help="RAM budget incl. runtime (MB)")] = None,
    max_storage_mb: Annotated[float | None, typer.Option("--max-storage-mb", help="weights storage budget (MB)")] = None,
    max_latency_ms: Annotated[float | None, typer.Option("--max-latency-ms", help="latency budget (ms)")] = None,
    max_power_w: Annotated[float | None, typer.Option("--max-power-w", help="power budget (W)")] = None,
    max_energy_mj: Annotated[float | None, typer.Option("--max-energy-mj", help="energy per inference budget (mJ)")] = None,
    max_accuracy_drop: Annotated[float | None, typer.Option("--max-accuracy-drop", help="accuracy drop budget (points, with --eval)")] = None,
    eval_data: Annotated[str | None, typer.Option("--eval", help="eval .npz: build the choice and check its accuracy")] = None,
    calib: Annotated[str | None, typer.Option("--calib", help="calibration .npz for INT8 builds (with --eval)")] = None,
    input_shape: ShapeOpt = None,
    board_set: SetOpt = None,
    no_calibration: Annotated[bool, typer.Option("--no-calibration", help="ignore the board's stored calibration")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    report: Annotated[Path | None, typer.Option("--output", "-o", help="write report.html and PNGs to this folder")] = None,
    build: Annotated[Path | None, typer.Option("--build", help="with --eval: keep the chosen build in this folder")] = None,
) -> None:
    """Choose precision, pruning and power mode for MODEL on a board from its budgets (estimates first)."""
    from edgekit.planner import BUDGET_NAMES, Budgets, analyze, choose, fmt_budget, plan_target
    from edgekit.units import fmt_mb
    from edgekit.refine import refine
    from edgekit.fsutil import work_dir
    from edgekit.profiles import load_board

    brd = load_board(board, board_set)
    tgt = plan_target(brd, target)
    budgets = Budgets.for_board(brd, ram_mb=max_ram_mb, storage_mb=max_storage_mb, latency_ms=max_latency_ms,
                                power_w=max_power_w, energy_mj=max_energy_mj, accuracy_drop_points=max_accuracy_drop)
    # the model is loaded, analyzed and exported once; the estimate and every --eval build reuse it
    with work_dir("edgekit-plan-") as work:
        with err.status("analyzing and estimating…"):
            analyzed = analyze(model, tgt, Path(work), input_shape)
            p = choose(analyzed, brd, tgt, budgets, use_calibration=not no_calibration)
        if eval_data:
            with err.status("building the choice and measuring accuracy…"):
                p = refine(p, analyzed, eval_data, calib=calib, board_set=board_set, out=build,
                           log=lambda m: err.print(f"  [dim]{m}[/]"))
    if report is not None:
        from edgekit.report_html import write_report

        path = write_report(p, report)
        if not as_json:
            console.print(f"report: {path}")
    if as_json:
        print(json.dumps(p.to_json(), indent=2))
        return
    b = p.budgets
    overhead = p.choice.estimate.runtime_overhead_mb
    budget = {k: fmt_budget(k, getattr(b, k)) for k in ("ram_mb", "storage_mb", "latency_ms", "power_w", "energy_mj")
              if getattr(b, k) is not None}
    console.print(f"[bold]{brd.id}[/] ({p.target}), budgets: RAM {budget['ram_mb']} for the whole process "
                  f"(runtime overhead {fmt_budget('ram_mb', overhead)} + model "
                  f"{fmt_budget('ram_mb', b.ram_mb - overhead)}), "
                  f"storage {budget['storage_mb']}, latency {budget['latency_ms']}, power {budget['power_w']}"
                  + (f", energy {budget['energy_mj']}" if "energy_mj" in budget else "")
                  + f", accuracy drop {_num(b.accuracy_drop_points)} point{'' if b.accuracy_drop_points == 1 else 's'}"
                  + ("  [dim](calibrated cost model)[/]" if p.calibrated else ""), highlight=False)
    t = Table(title="candidates (estimates; RAM is the model's, each adds the runtime's "
                    f"{fmt_budget('ram_mb', overhead)})", title_justify="left")
    for col, just in (("candidate", "left"), ("model RAM", "right"), ("storage", "right"),
                      ("latency ms", "right"), ("energy mJ", "right"), ("fits", "left")):
        t.add_column(col, justify=just, no_wrap=col == "candidate")
    chosen = p.choice.estimate.candidate
    for s in p.candidates:
        e = s.estimate
        mark = " [bold green]◀ chosen[/]" if e.candidate == chosen else ""
        # a fitting candidate names the budget it comes closest to; one that does not, what it exceeds
        fits = (f"[green]yes[/] ({BUDGET_NAMES[s.binding]} {s.usage[s.binding]:.0%})" if s.fits else
                "[red]no: " + ", ".join(f"{BUDGET_NAMES[k]} +{fmt_budget(k, v)}" for k, v in s.over.items()) + "[/]")
        t.add_row(e.candidate.label, fmt_mb(e.ram_mb - e.runtime_overhead_mb), fmt_mb(e.storage_mb),
                  f"{e.latency_ms:.4g}", f"{e.energy_mj:.4g}", fits + mark)
    fit(t)
    console.print(t)
    for step in p.eval_steps:
        console.print(f"eval: {len(step.float_layers)} layer(s) kept float → accuracy {step.accuracy:.2%} "
                      f"(float {step.float_accuracy:.2%}, drop {step.drop_points:.2f} points)")
    if p.build_dir:
        console.print(f"build: {p.build_dir}")
    for n in p.notes:
        console.print(f"[dim]note: {n}[/]")
    console.print(f"[bold green]choice:[/] {p.reason}")


@app.command()
def calibrate(
    board: Annotated[str, typer.Option("--board", "-b", help="board to calibrate (host: measured here)")] = "host",
    iterations: Annotated[int, typer.Option("--iterations", "-n", help="timed runs per model and precision")] = 50,
    model: Annotated[list[str] | None, typer.Option("--model", help="also/only time this model (repeatable)")] = None,
    input_shape: ShapeOpt = None,
    precision: Annotated[list[str] | None, typer.Option("--precision", "-p", help="precisions to time (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Measure real latency (host: onnxruntime on this CPU), fit the board's cost-model constants, store them."""
    from edgekit.calibrate import calibrate as run
    from edgekit.calibration_store import store_path
    from edgekit.errors import InputSpecError

    if iterations < 1:
        raise InputSpecError("--iterations must be at least 1")
    models = [(m, input_shape, "random") for m in model] if model else None
    with err.status("measuring…"):
        store = run(board, iterations=iterations, models=models, precisions=precision,
                    log=lambda m: err.print(f"  [dim]{m}[/]"))
    f = store["fit"]
    if as_json:
        print(json.dumps(store, indent=2))
        return
    console.print(f"fitted {store['board']} on {f['samples']} measurement(s) "
                  f"({f['results_store_samples']} from the results store): launch overhead {f['launch_overhead_us']:.1f} us, "
                  f"bandwidth x{f['bandwidth_factor']:.3g}")
    for key in ("efficiency", "class_efficiency", "activation_passes"):
        if f.get(key):
            console.print(f"  {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(f[key].items())))
    console.print(f"  fitted: {', '.join(f['fitted'])} (the rest stays at the profile's values)")
    console.print(f"median |estimate - measured| / measured: {f['median_abs_error_before']:.1%} before, "
                  f"{f['median_abs_error_after']:.1%} after")
    console.print(f"stored: {store_path(store['board'])} (later plans for this board use it; --no-calibration ignores it)")
