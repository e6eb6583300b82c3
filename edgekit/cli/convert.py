"""`edgekit convert` and `edgekit inspect`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from edgekit.cli.common import (
    BatchAxisOpt,
    CacheDirOpt,
    CarryOpt,
    ConstOpt,
    SequenceLengthOpt,
    SetOpt,
    ShapeOpt,
    app,
    console,
    err,
    mb,
)


@app.command()
def convert(
    model: Annotated[str, typer.Argument(help="model file (.pt2, .pt, .onnx, .keras, .h5), SavedModel folder, or pkg.module:factory")],
    target: Annotated[str, typer.Option("--target", "-t", help="output target, see `edgekit targets`")] = "jetson",
    out: Annotated[Path | None, typer.Option("--output", "-o", help="output folder (default: MODEL-TARGET-PRECISION under build/; replaced only if edgekit wrote it)")] = None,
    board: Annotated[str | None, typer.Option("--board", "-b", help="board profile, see `edgekit boards`")] = None,
    precision: Annotated[str, typer.Option("--precision", "-p", help="auto (the planner picks from the board's budgets) | fp32 | fp16 | int8 | ... (see `edgekit targets`)")] = "auto",
    calib: Annotated[str | None, typer.Option("--calib", help="calibration .npz, or 'random' (accuracy then unknown)")] = None,
    eval_data: Annotated[str | None, typer.Option("--eval", help="eval .npz with inputs and 'label': float vs converted accuracy")] = None,
    input_shape: ShapeOpt = None,
    const: ConstOpt = None,
    batch_axis: BatchAxisOpt = None,
    carry: CarryOpt = None,
    sequence_length: SequenceLengthOpt = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle", help="allow torch.load of a pickled module (runs code from the file)")] = False,
    board_set: SetOpt = None,
    opset: Annotated[int | None, typer.Option("--opset", help="ONNX opset (default: the target's)")] = None,
    golden: Annotated[int, typer.Option("--golden", help="golden samples, drawn across the data (stratified by label)")] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="print the manifest as JSON")] = False,
    option: Annotated[list[str] | None, typer.Option("--option", help="converter option key=value, e.g. layout=nhwc, allow_float_fallback=true (android)")] = None,
    output_kind: Annotated[list[str] | None, typer.Option("--output-kind", help="how an output is judged: NAME=KIND, KIND one of class, regression, mask, index, detection, detection_cf, ctc (default: inferred)")] = None,
    eval_output: Annotated[str | None, typer.Option("--eval-output", help="the output --eval labels are scored on (default: the first class output)")] = None,
    max_data_mb: Annotated[float | None, typer.Option("--max-data-mb", help="largest --calib/--eval arrays to load, MB (default 1024; env EDGEKIT_MAX_DATA_MB)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild even when the build cache holds this build")] = False,
    cache_dir: CacheDirOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="show the toolchains' own output live (always kept in the build's toolchain.log)")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="int8: fail when verification fails, instead of keeping the most sensitive layers at higher precision")] = False,
    search_budget: Annotated[float | None, typer.Option("--search-budget", min=1, help="int8: seconds the build may take with its mixed-precision search and rebuild (default 300); the search gets what the first build and verification left, less the rebuild's estimate")] = None,
    allow_slower_int8: Annotated[bool, typer.Option("--allow-slower-int8", help="int8: pass a build that runs slower than the fp32 build on the target's host runtime (default: it fails; INT8 is for speed)")] = False,
    tolerance: Annotated[list[str] | None, typer.Option("--tolerance", help="tighten (or loosen) the target's verification bar: key=value, e.g. min_top1_agreement=0.99 (an int8 build that misses it keeps layers at higher precision)")] = None,
) -> None:
    """Convert MODEL for a target board and verify it on the host against the float model."""
    from edgekit.cli.progress import StageProgress
    from edgekit.pipeline import convert as run_convert
    from edgekit.profiles import parse_overrides

    with StageProgress(live=not verbose) as progress:
        res = run_convert(
            model, target=target, out=out, board=board, precision=precision, calib=calib, eval_data=eval_data,
            input_shape=input_shape, consts=const, batch_axes=batch_axis, carries=carry,
            sequence_length=sequence_length, trust_pickle=trust_pickle, board_set=board_set, opset=opset,
            golden_count=golden, options=parse_overrides(option, "--option", "allow_float_fallback=true") or None,
            max_data_mb=max_data_mb, output_kinds={k: str(v) for k, v in parse_overrides(
                output_kind, "--output-kind", "landmarks=regression").items()} or None,
            eval_output=eval_output, strict=strict, allow_slower_int8=allow_slower_int8,
            search_budget_s=search_budget, log=lambda m: err.print(f"  [dim]{m}[/]"),
            warn=lambda m: err.print(f"[yellow]warning:[/] {m}"), on_stage=progress.on_stage, verbose=verbose,
            cache=not no_cache, cache_dir=cache_dir,
            tolerance=parse_overrides(tolerance, "--tolerance", "min_top1_agreement=0.99") or None,
        )
    man = res.manifest
    if res.cache and res.cache["hit"]:
        from edgekit.cache import age

        err.print(f"[green]✓[/] cache hit {res.cache['key'][:12]}: built {res.cache['built_utc']} "
                  f"({age(res.cache['built_utc'])} ago), verified then; --no-cache rebuilds")
    if as_json:
        print(json.dumps(man, indent=2))
        return
    from edgekit.report_md import near_ties

    v = res.verification
    t = Table(title=f"host verification: {v.runtime}, {v.golden_samples} golden samples", title_justify="left")
    for col in ("output", "max abs err", "rel err", "tolerance", "top-1 agree", "result"):
        t.add_column(col)
    for o in v.outputs:
        t.add_row(o.name, f"{o.max_abs_error:.4g}", f"{o.max_rel_error:.3%}", f"{o.tolerance_rel:.2%}",
                  "—" if o.top1_agreement is None else f"{o.top1_agreement:.1%}" + (
                      f" ({near_ties(o.metrics)})" if near_ties(o.metrics) else ""),
                  ("[yellow]pass, max error warned[/]" if o.warnings else "[green]pass[/]") if o.passed
                  else "[red]FAIL[/]")
    console.print(t)
    if v.float_accuracy is not None:
        lo, hi = v.converted_accuracy_ci95 or (0.0, 1.0)
        console.print(f"accuracy ({v.eval_samples} samples): float {v.float_accuracy:.2%} → "
                      f"{man['precision']} {v.converted_accuracy:.2%} (95% CI {lo:.1%}–{hi:.1%})"
                      + _paired(v))
    if v.carried:  # --carry: each model over the golden sequence with its own state
        from edgekit.carry import summary

        console.print(summary(v.carried))
    if v.against_original:  # a fine-tuned model: how the build compares with the float model it came from
        console.print(v.against_original["summary"])
    prim = man["artifact"]["primary"]
    # the primary artifact may be a folder (a Core ML .mlpackage): sum its files
    prim_bytes = sum(f["bytes"] for k, f in man["files"].items() if k == prim or k.startswith(prim + "/"))
    console.print(f"[bold green]converted[/] {man['source_model']['path']} → {res.out_dir / prim} "
                  f"({mb(prim_bytes)}, {man['precision']}, board {man['board']['id']})")
    sp = man["artifact"].get("speed")
    if sp:  # the INT8 build's speed against fp32 on the target's host runtime (edgekit.speed)
        colour = "red" if sp["slower"] else "green" if sp["speedup"] > 1 else "yellow"
        fp = sp.get("float_precision", "fp32")
        how = ", estimated" if sp.get("estimated") else ""
        console.print(f"[{colour}]speed[/] {sp['runtime']}: {man['precision']} {sp['ms']:.4g} ms, {fp} "
                      f"{sp['float_ms']:.4g} ms ({sp['speedup']:.2f}x the {fp} build's speed{how})")
    for n in res.notes:
        if not n.startswith("speed on "):  # printed above
            console.print(f"[dim]note: {n}[/]")
    console.print(f"report: {res.out_dir / 'report.md'}", soft_wrap=True)
    console.print("board smoke test: python3 run.py (in the bundle)")


def _paired(v) -> str:
    """", drop 0.22 points (paired 95% CI -0.13 to 0.22: 1 sample(s) lost, 0 won)", or "" without labels."""
    if v.accuracy_drop_ci95 is None:
        return ""
    lo, hi = v.accuracy_drop_ci95
    drop = 100 * (v.float_accuracy - v.converted_accuracy)
    return (f", drop {drop:.2f} points (paired 95% CI {lo:.2f} to {hi:.2f}: {v.accuracy_lost} sample(s) lost, "
            f"{v.accuracy_won} won)")


@app.command()
def inspect(
    model: Annotated[str, typer.Argument(help="model file (.pt2, .pt, .onnx, .keras, .h5), SavedModel folder, or pkg.module:factory")],
    target: Annotated[str | None, typer.Option("--target", "-t", help="also check ops against this target")] = None,
    input_shape: ShapeOpt = None,
    const: ConstOpt = None,
    batch_axis: BatchAxisOpt = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    top: Annotated[int, typer.Option("--top", help="rows in the per-layer table (0 = all)")] = 0,
    precision: Annotated[str | None, typer.Option("--precision", "-p", help="with --target: also check this precision on the board")] = None,
    board: Annotated[str | None, typer.Option("--board", "-b", help="with --precision: the board (default: the target's)")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="converter option key=value, as for convert")] = None,
) -> None:
    """Parameters, MACs, weight bytes per precision, peak live activations, per-layer table; with --target,
    the same checks convert runs before building (input kind, options, precision, ops), through the same code."""
    from edgekit import stages
    from edgekit.analyze import analyze_model
    from edgekit.converters import check_options
    from edgekit.fsutil import work_dir
    from edgekit.profiles import default_board, load_board, load_target, parse_overrides

    tgt = load_target(target) if target else None
    opts = check_options(tgt.converter, parse_overrides(option, "--option", "allow_float_fallback=true")) if tgt else {}
    if precision and tgt is not None and precision != "auto":
        stages.check_precision(precision, tgt, load_board(board) if board else default_board(tgt.name))
    m = stages.ingest(model, tgt, input_shape, trust_pickle, None, None, None, const,
                      batch_axes=batch_axis).model  # convert's ingest stage
    with work_dir("edgekit-") as tmp:
        # the same analysis as convert's analyze stage (ONNX graph; fp32 .tflite for Keras / SavedModel)
        stats, _ = analyze_model(m, Path(tmp), tgt)
    refusal = stages.op_refusal(stats, tgt, opts, precision=None if precision == "auto" else precision) if tgt is not None else None
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
        console.print("weight bytes: " + "   ".join(f"{k} {mb(b)}" for k, b in stats.weight_bytes.items()))
        console.print(f"peak live activations: {mb(stats.peak_activation_bytes)} "
                      f"(all activations summed: {mb(stats.total_activation_bytes)})")
        console.print("ops: " + ", ".join(f"{k}×{n}" for k, n in stats.ops.items()))
        if tgt is not None:
            if stats.unsupported:
                console.print(f"[red]{len(stats.unsupported)} op(s) target {tgt.name} cannot run:[/]")
                for u in stats.unsupported:
                    console.print(f"  {u['op']}  (node {u['node']})")
                console.print("convert would " + (f"refuse it: {refusal}" if refusal else
                                                  "keep them float (allow_float_fallback)"))
            else:
                console.print(f"[green]every op is supported by target {tgt.name}[/]")
    if refusal:
        raise typer.Exit(1)
