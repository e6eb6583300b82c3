"""The conformance run: every zoo model x target x precision through convert (whose ingest and analyze stages are
the checks `edgekit inspect --target` runs), each cell in its own process (a crash or a hang stays in its cell),
and the table in Markdown and JSON."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from edgekit.zoo import ZooModel, cache_dir, fetch, other_files, select, source
from edgekit.zoo import data as zdata

# per target: the float precision (its default float path) and int8
CELLS: dict[str, list[str]] = {"jetson": ["fp32", "int8"], "android": ["fp32", "int8"], "ios": ["fp16", "int8"],
                               "fpga": ["int8"]}
CELL_TIMEOUT_S = 900


def prepare_data(m: ZooModel, log=lambda s: None) -> Path:
    """The model's real inputs as ``<cache>/data/<name>-<key>.npz``, built once per recipe: the key hashes the
    recipe and ``zoo.data.VERSION``, so a changed recipe never reuses inputs an older one made."""
    key = hashlib.sha256(f"{m.data}|{zdata.VERSION}".encode()).hexdigest()[:10]
    dest = cache_dir() / "data" / f"{m.name}-{key}.npz"
    if dest.is_file():
        return dest
    # openWakeWord's heads take features its own front end makes: those two zoo models run in the recipe
    files = {z.name: fetch(z) for z in select(["oww-melspec", "oww-embedding"])} if m.data.startswith("oww_") else {}
    files.update(other_files(m, log))
    log(f"{m.name}: building inputs ({m.data})")
    arr = zdata.build(m.data, cache_dir(), files)
    arrays = arr if isinstance(arr, dict) else {_first_input(m): arr}  # a recipe for several inputs names them
    dest.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own per process: two runs building the same inputs at once each write whole files, and the
    # last rename wins (a shared ".part" name lost the race: one run renamed the other's file away from under it)
    fd, name = tempfile.mkstemp(prefix=f".{dest.stem}.", suffix=".part.npz", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        np.savez(tmp, **arrays)
        tmp.replace(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _first_input(m: ZooModel) -> str:
    """The input the recipe feeds (the zoo's models have one input besides their --const ones)."""
    from edgekit.input_spec import parse_shapes

    named = [n for n, _ in parse_shapes(m.input_shape) if n]
    if named:
        return named[0]
    if m.factory or not m.path.endswith(".onnx"):  # a single-input model takes its one array by any name
        return "input_0"
    import onnx

    from edgekit.onnx_prepare import model_inputs

    consts = {c.split("=")[0] for c in m.const}
    return next(i.name for i in model_inputs(onnx.load(str(fetch(m)))) if i.name not in consts)


def run_cell(m: ZooModel, target: str, precision: str, data: Path, out: Path, timeout: int = CELL_TIMEOUT_S,
             cache: bool = True) -> dict:
    spec = {"cache": cache, "model": source(m), "target": target, "precision": precision, "out": str(out / f"{m.name}-{target}-{precision}"),
            "data": str(data), "input_shape": m.input_shape, "const": m.const,
            "output_kinds": dict(k.split("=", 1) for k in m.output_kind), "carry": m.carry,
            "batch_axis": m.batch_axis, "sequence_length": m.sequence_length, "golden": m.golden}
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run([sys.executable, "-m", "edgekit.zoo.cell", json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": "timeout", "reason": f"no result within {timeout} s",
                "seconds": round(time.perf_counter() - t0, 1)}
    line = next((ln for ln in proc.stdout.splitlines()[::-1] if ln.startswith("ZOO-CELL ")), None)
    if line is None:
        tb = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return {"status": "failed", "error": "traceback", "traceback": True,
                "reason": (tb[-1] if tb else f"exit {proc.returncode}")[:400],
                "seconds": round(time.perf_counter() - t0, 1)}
    res = json.loads(line[len("ZOO-CELL "):])
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["traceback"] = False
    return res


def run(models: list[str] | None = None, targets: list[str] | None = None, out: Path = Path("zoo-results"),
        log=print, precisions: list[str] | None = None, cache: bool = True) -> dict:
    """Run the cells of ``models`` x ``targets`` (x ``precisions``), each in its own process, into ``out``.
    ``cache=False``: every cell builds cold (no build cache, no cached float export), so an INT8 cell is not
    shortened by the fp32 cell that ran before it."""
    chosen = select(models)
    targets = targets or list(CELLS)
    out.mkdir(parents=True, exist_ok=True)
    from datetime import date

    from edgekit import __version__

    results = {"edgekit_zoo": 1, "cells": []}
    prior = out / "results.json"
    if prior.is_file():  # a run over a subset keeps the other cells
        results = json.loads(prior.read_text())
        keep = {(m.name, t) for m in chosen for t in targets}
        results["cells"] = [c for c in results["cells"] if (c["model"], c["target"]) not in keep
                            or (precisions and c["precision"] not in precisions)]
    results.update(date=date.today().isoformat(), edgekit=__version__)
    for m in chosen:
        size = fetch(m, log).stat().st_size
        data = prepare_data(m, log)
        for t in targets:
            for p in CELLS[t]:
                if precisions and p not in precisions:
                    continue
                res = run_cell(m, t, p, data, out / "builds", cache=cache)
                res.update(model=m.name, target=t, precision=p, source_bytes=size, carry=m.carry or None)
                if res.get("artifact_bytes"):
                    res["size_ratio"] = round(res["artifact_bytes"] / size, 3)
                results["cells"].append(res)
                log(f"{m.name:16} {t:8} {p:5} {res['status']:8} {res['seconds']:6.1f}s  "
                    f"{(res.get('reason') or '')[:110]}")
                (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "zoo.md").write_text(render(results))
    return results


def _agree(c: dict) -> str:
    parts = []
    for name, a in (c.get("eval_agreement") or {}).items():
        if "text_agreement" in a:  # a CTC recogniser: the text it reads
            parts.append(f"text {a['text_agreement']:.1%}, CER {a.get('cer', 0):.1%}")
        elif "top1_agreement" in a:
            parts.append(f"top-1 {a['top1_agreement']:.1%}")
        elif "iou" in a and "snr_db" in a:  # a detection head: the detected anchors, and their boxes
            parts.append(f"detections IoU {a['iou']:.2f}, boxes SNR {a['snr_db']:.0f} dB")
        elif "snr_db" in a:
            parts.append(f"SNR {a['snr_db']:.0f} dB")
        elif "iou" in a:
            parts.append(f"IoU {a['iou']:.2f}")
        elif "max_rel_error" in a:  # a score that never reaches 0.5: its values were compared, not a decision
            parts.append(f"max err {a['max_rel_error']:.1%}")
        if len(parts) == 2:
            break
    return ", ".join(parts) + (f" ({c['eval_samples']})" if parts and c.get("eval_samples") else "") or "—"


def render(results: dict) -> str:
    cells = results["cells"]
    lines = ["| model | target | precision | status | float agreement on held-out inputs | max rel err | size × | time | reason |",
             "|---|---|---|---|---|---|---|---|---|"]
    models = list(dict.fromkeys(c["model"] for c in cells))  # first-run order; a row run again stays in place
    order = [(t, p) for t, precs in CELLS.items() for p in precs]
    for c in sorted(cells, key=lambda c: (models.index(c["model"]), order.index((c["target"], c["precision"]))
                                          if (c["target"], c["precision"]) in order else len(order))):
        err = max((o["max_rel_error"] for o in c.get("outputs") or []), default=None)
        reason = (c.get("reason") or "").replace("|", "/").replace("\n", " ")
        model = c["model"] + (" (state carried)" if c.get("carry") else "")  # else folded by --const, if a state
        lines.append(f"| {model} | {c['target']} | {c['precision']} | {c['status']} | "
                     f"{_agree(c) if c['status'] in ('pass', 'failed') and c.get('eval_agreement') else '—'} | "
                     f"{'—' if err is None else f'{err:.2%}'} | {c.get('size_ratio', '—')} | {c['seconds']:.0f} s | "
                     f"{reason[:220]} |")
    tot = totals(cells)
    lines += ["", f"Totals: {tot['cells']} cells; pass {tot['pass']}, refused {tot['refused']}, failed {tot['failed']}, "
              f"tracebacks {tot['tracebacks']}. Float cells pass {tot['float_pass']}/{tot['float_cells']}; "
              f"INT8 cells pass {tot['int8_pass']}/{tot['int8_cells']} "
              f"({tot['int8_runnable']} not refused)."]
    return "\n".join(lines) + "\n"


def render_doc(results: dict, header: str) -> str:
    """docs/zoo.md: the header (what the zoo is, how ONNX reaches every target), the totals, per target, the
    slowest cells, then the table."""
    cells = results["cells"]
    tot = totals(cells)
    lines = [header.rstrip(), ""]
    lines.append(f"Run on {results.get('date', 'this machine')} (2 CPU cores, no GPU), edgekit {results.get('edgekit', '')}: "
                 f"**{tot['cells']} cells, {tot['pass']} pass, {tot['refused']} refused, {tot['failed']} failed, "
                 f"{tot['tracebacks']} tracebacks.**")
    lines.append("")
    fl_run = tot["float_cells"] - sum(c["status"] == "refused" for c in cells if c["precision"] != "int8")
    lines.append(f"- Float cells: {tot['float_pass']} of {tot['float_cells']} pass "
                 f"({tot['float_pass'] / max(1, tot['float_cells']):.0%}; {tot['float_pass']} of {fl_run} not refused).")
    lines.append(f"- INT8 cells: {tot['int8_pass']} of {tot['int8_cells']} pass; of the {tot['int8_runnable']} whose ops "
                 f"the target runs in int8 (not refused), {tot['int8_pass'] / max(1, tot['int8_runnable']):.0%} pass.")
    lines += ["", "| target | precision | pass | refused | failed |", "|---|---|---|---|---|"]
    for t, precs in CELLS.items():
        for p in precs:
            cs = [c for c in cells if c["target"] == t and c["precision"] == p]
            if cs:
                lines.append(f"| {t} | {p} | {sum(c['status'] == 'pass' for c in cs)} | "
                             f"{sum(c['status'] == 'refused' for c in cs)} | {sum(c['status'] == 'failed' for c in cs)} |")
    slow = sorted(cells, key=lambda c: -c["seconds"])[:5]
    lines += ["", "Slowest cells: " + "; ".join(f"{c['model']} {c['target']} {c['precision']} {c['seconds']:.0f} s"
                                               for c in slow) + ".", ""]
    lines.append(render(results))
    footer = Path(__file__).with_name("zoo-footer.md")
    if footer.is_file():
        lines.append(footer.read_text())
    return "\n".join(lines)


def totals(cells: list[dict]) -> dict:
    fl = [c for c in cells if c["precision"] != "int8"]
    i8 = [c for c in cells if c["precision"] == "int8"]
    return {"cells": len(cells), "pass": sum(c["status"] == "pass" for c in cells),
            "refused": sum(c["status"] == "refused" for c in cells),
            "failed": sum(c["status"] == "failed" for c in cells),
            "tracebacks": sum(bool(c.get("traceback")) for c in cells),
            "float_cells": len(fl), "float_pass": sum(c["status"] == "pass" for c in fl),
            "int8_cells": len(i8), "int8_pass": sum(c["status"] == "pass" for c in i8),
            "int8_runnable": sum(c["status"] != "refused" for c in i8)}
