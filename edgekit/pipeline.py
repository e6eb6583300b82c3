"""The convert pipeline as one API call: ingest -> analyze -> convert -> verify -> bundle.

Stages run in a declared order, each timed; the output folder is built as a temporary
sibling and renamed into place, so a failed or killed run leaves nothing half-written.
A build whose host verification fails is still written (so its report can be read) but
is marked failed in the manifest, and the call raises VerificationError afterwards:
`edgekit bundle` refuses such a build.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from edgekit import __version__
from edgekit.analyze import ModelStats, analyze_model
from edgekit.data import Dataset, load_npz, random_dataset
from edgekit.errors import InputSpecError, ProfileError, UnsupportedOpError, VerificationError
from edgekit.fsutil import atomic_dir, check_replaceable, sha256_file, work_dir
from edgekit.ingest import Model, check_target_takes, load_model
from edgekit.manifest import SCHEMA_VERSION, Manifest
from edgekit.planner import plan_section
from edgekit.profiles import Board, Target, data_dir, default_board, load_board, load_target
from edgekit.verify import Verification, verify

MIN_OPSET, MAX_OPSET = 7, 25  # what onnx and onnxruntime know of; per-channel INT8 needs 13 or more
STAGES = ("ingest", "analyze", "convert", "verify", "bundle")
GOLDEN_FILE = "golden.npz"


@dataclass
class ConvertResult:
    out_dir: Path
    manifest: dict[str, Any]
    verification: Verification
    stats: ModelStats
    timings_s: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Clock:
    def __init__(self, on_stage: Callable[[str, str], None]) -> None:
        self.times: dict[str, float] = {}
        self.on_stage = on_stage

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        assert name in STAGES and list(self.times) == list(STAGES[: STAGES.index(name)]), name
        self.on_stage(name, "start")
        t0 = time.perf_counter()
        yield
        self.times[name] = time.perf_counter() - t0
        self.on_stage(name, f"{self.times[name]:.2f} s")


def check_precision(precision: str, target: Target, board: Board) -> None:
    if precision not in target.precisions:
        raise ProfileError(
            f"precision {precision!r} is not offered by target {target.name!r}; choose one of {target.precisions}"
        )
    if precision not in board.precisions:
        raise ProfileError(
            f"board {board.id} has no {precision} compute path (its profile lists {board.precisions}); "
            f"choose --precision {board.precisions[-1] if board.precisions else 'fp32'}"
        )


def _check_calibration(precision: str, calib_ds: Dataset | None, warn: Callable[[str], None]) -> None:
    if precision != "int8":
        return
    if calib_ds is None:
        raise InputSpecError(
            "INT8 needs calibration data: give --calib FILE.npz (a few hundred real inputs), "
            "or --calib random to accept unknown accuracy"
        )
    if calib_ds.random:
        warn("--calib random: INT8 ranges come from random inputs; accuracy on real data is unknown")


def convert(
    model: str | Path | Model,
    target: str = "jetson",
    out: str | Path = "build",
    board: str | None = None,
    precision: str | None = None,
    calib: str | None = None,
    eval_data: str | None = None,
    input_shape: list[str] | None = None,
    trust_pickle: bool = False,
    board_set: list[str] | None = None,
    opset: int | None = None,
    golden_count: int = 16,
    options: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda m: None,
    warn: Callable[[str], None] = lambda m: None,
    on_stage: Callable[[str, str], None] = lambda s, m: None,
    analysis: tuple[ModelStats, Path] | None = None,
    max_data_mb: float | None = None,
    fail_on_verification: bool = True,
) -> ConvertResult:
    """Convert ``model`` for ``target`` on ``board`` into the folder ``out``.

    ``model`` may be an already loaded :class:`Model` (not loaded again), and ``analysis``
    that Model's ``analyze_model(model, work, target)`` result (stats, float graph), which is
    then not analyzed or exported again: the planner passes both for its builds.
    """
    from edgekit.converters import ConvertJob, check_options, converter_info, flag_option, get_converter

    if isinstance(golden_count, bool) or not isinstance(golden_count, int) or golden_count < 1:
        raise InputSpecError(f"--golden {golden_count}: give the number of golden samples, at least 1 (default 16)")
    if opset is not None and not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputSpecError(f"--opset {opset}: give an ONNX opset from {MIN_OPSET} to {MAX_OPSET}, "
                             "or leave it out for the target's default")
    check_replaceable(Path(os.path.abspath(out)))  # a foreign -o is refused before minutes of work, and again at the end
    tgt = load_target(target)
    options = check_options(tgt.converter, options) or None
    brd = load_board(board, board_set) if board else default_board(target)
    if board_set and not board:
        brd = load_board(brd.id, board_set)
    if target not in brd.targets:
        raise ProfileError(f"board {brd.id} does not take target {target!r} (its targets: {brd.targets})")
    precision = precision or tgt.default_precision
    if precision != "auto":  # "auto" is resolved by the planner once the analyze stage has the model's stats
        check_precision(precision, tgt, brd)
    plan = None
    warnings: list[str] = []

    def _warn(msg: str) -> None:
        warnings.append(msg)
        warn(msg)

    clock = _Clock(on_stage)
    with work_dir("edgekit-") as tmp:
        work = Path(tmp)
        with clock.stage("ingest"):
            check_target_takes(model, tgt)  # Keras / SavedModel: android only, refused before loading TensorFlow
            m = model if isinstance(model, Model) else load_model(model, input_shape, trust_pickle)
            calib_ds: Dataset | None = None
            if calib == "random":
                calib_ds = random_dataset(m)
            elif calib:
                calib_ds = load_npz(calib, m, what="--calib", max_mb=max_data_mb)
            if precision != "auto":
                _check_calibration(precision, calib_ds, _warn)
            eval_ds = (load_npz(eval_data, m, need_labels=True, what="--eval", max_mb=max_data_mb)
                       if eval_data else None)
        with clock.stage("analyze"):
            # torch -> ONNX export, ONNX as given, Keras / SavedModel -> fp32 .tflite (TFLiteConverter)
            stats, float_graph = analysis if analysis is not None else analyze_model(m, work, tgt, opset)
            if precision == "auto":  # the budget-driven planner picks from the stats just computed
                from edgekit.planner import choose

                plan = choose(m, brd, tgt, stats=stats, prunable=False)
                precision = plan.precision
                log(f"plan: {plan.reason}")
                check_precision(precision, tgt, brd)
                _check_calibration(precision, calib_ds, _warn)
            if stats.unsupported and flag_option(options, "allow_float_fallback"):
                _warn(f"{len(stats.unsupported)} op(s) outside target {tgt.name}'s list kept (allow_float_fallback): "
                      + ", ".join(f"{u['op']} (node {u['node']})" for u in stats.unsupported[:10]))
            elif stats.unsupported:
                listed = ", ".join(f"{u['op']} (node {u['node']})" for u in stats.unsupported[:10])
                fix = "replace them in the model or choose another target"
                if converter_info(tgt.converter).float_fallback:  # such ops can stay float (audited after converting)
                    fix += ", or pass --option allow_float_fallback=true to keep them float"
                raise UnsupportedOpError(f"target {tgt.name} cannot run {len(stats.unsupported)} op(s): {listed}; {fix}")
        golden_ds = eval_ds or calib_ds or random_dataset(m, n=golden_count)
        with atomic_dir(Path(out)) as out_tmp:
            job = ConvertJob(
                model=m, target=tgt, board=brd, precision=precision,
                calib=calib_ds,
                out_dir=out_tmp, work_dir=work,
                options={"opset": opset, **(options or {})}, log=log, warn=_warn,
                float_onnx=float_graph if m.is_torch else None,
                float_tflite=float_graph if m.is_tf else None,
            )
            conv = get_converter(tgt.converter)
            with clock.stage("convert"):
                artifact = conv.convert(job)
            with clock.stage("verify"):
                runner = conv.host_runner(job, artifact)
                tol = tgt.tolerances[precision]
                verification, golden_in, golden_out = verify(
                    m, m.reference(), runner, golden_ds, golden_count, tol, artifact.runtime, precision, eval_ds
                )
            with clock.stage("bundle"):
                manifest = _write_bundle(
                    out_tmp, m, tgt, brd, precision, artifact, verification, golden_in, golden_out,
                    calib_ds, stats, conv, warnings, clock.times, plan_section(stats, brd, precision, plan),
                )
        result = ConvertResult(Path(out).resolve(), manifest, verification, stats, clock.times, warnings, artifact.notes)
    try:  # results store (edgekit.results): a full disk or locked db must not fail a finished conversion
        from edgekit.results import manifest_fields, record

        record("convert", **manifest_fields(manifest), passed=verification.passed, out=str(result.out_dir),
               timings_s=manifest.get("timings_s"), verification=manifest.get("verification"))
    except Exception as exc:  # noqa: BLE001
        warn(f"results store not updated: {exc}")
    if not verification.passed and fail_on_verification:
        raise VerificationError(
            "host verification failed: " + "; ".join(verification.failures)
            + f" (build kept for inspection in {result.out_dir}, marked failed)"
        )
    return result


def _write_bundle(out: Path, m: Model, tgt: Target, brd: Board, precision: str, artifact, verification: Verification,
                  golden_in: dict[str, np.ndarray], golden_out: list[np.ndarray], calib_ds: Dataset | None,
                  stats: ModelStats, conv, warnings: list[str], times: dict[str, float],
                  plan: dict[str, Any] | None = None) -> dict[str, Any]:
    arrays: dict[str, np.ndarray] = {}
    g_inputs, g_outputs = [], []
    for i, spec in enumerate(m.inputs):
        arrays[f"input_{i}"] = golden_in[spec.name]
        g_inputs.append({"name": spec.name, "key": f"input_{i}", "shape": list(spec.shape), "dtype": spec.dtype})
    for i, (spec, arr) in enumerate(zip(m.outputs, golden_out, strict=True)):
        arrays[f"output_{i}"] = arr
        g_outputs.append({"name": spec.name, "key": f"output_{i}", "shape": list(arr.shape[1:]), "dtype": str(arr.dtype)})
    np.savez(out / GOLDEN_FILE, **arrays)

    runner_src = data_dir("firmware") / tgt.runner
    if not runner_src.is_dir():
        raise ProfileError(f"target {tgt.name}: runner folder firmware/{tgt.runner} is missing from the install")
    runner_files = []
    # the target's runner, plus the smoke-test core every runner imports (firmware/common)
    for src in (runner_src, data_dir("firmware") / "common"):
        for p in sorted(src.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                rel = p.relative_to(src)
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, out / rel)
                runner_files.append(rel.as_posix())

    tol = tgt.tolerances[precision]
    budgets = brd.budgets
    manifest: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "name": bundle_name(m.source, tgt.name, precision),
        "edgekit_version": __version__,
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {"platform": platform.platform(), "python": platform.python_version()},
        "target": tgt.name,
        "format": artifact.format,
        "precision": precision,
        "board": {"id": brd.id, "description": brd.description, "default_power_mode": brd.default_power_mode,
                  "profile": brd.model_dump(mode="json")},
        "source_model": {"path": m.source, "kind": m.kind, "sha256": m.sha256},
        "inputs": [s.to_json() for s in m.inputs],
        "outputs": [s.to_json() for s in m.outputs],
        "calibration": None if calib_ds is None else {
            "source": calib_ds.source, "random": calib_ds.random, "samples": len(calib_ds),
            "sha256": None if calib_ds.random else sha256_file(Path(calib_ds.source)),
            "used_for": "int8 ranges" if precision == "int8" else "golden inputs only",
        },
        "artifact": {"primary": artifact.primary, "format": artifact.format, **artifact.meta},
        "toolchain": {"edgekit": __version__, **(conv.versions() if hasattr(conv, "versions") else {})},
        "budgets": {"latency_ms": budgets.latency_ms, "power_w": budgets.power_w,
                    "ram_mb": round(budgets.model_ram_share * brd.ram_mb, 1),
                    "storage_mb": budgets.storage_mb, "energy_mj": budgets.energy_mj},
        "golden": {"file": GOLDEN_FILE, "samples": int(next(iter(golden_in.values())).shape[0]),
                   "source": verification.golden_source, "inputs": g_inputs, "outputs": g_outputs},
        "tolerance": tol.model_dump(),
        "analysis": {k: v for k, v in stats.to_json().items() if k != "layers"},
        "verification": verification.to_json(),
        "runner": {"entry": "run.py", "files": sorted(runner_files)},
        "timings_s": {k: round(v, 3) for k, v in times.items()},
        "plan": plan,  # cost-model estimate of this build (edgekit.planner); read back to recalibrate
        "warnings": warnings,
        "notes": artifact.notes + verification.notes,
    }
    (out / "report.md").write_text(render_report(manifest, stats))
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest["files"] = {
        p.relative_to(out).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files
    }
    record = Manifest.model_validate(manifest)  # the one schema, checked on the writing side too
    manifest = record.to_json()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def bundle_name(source: str, target: str, precision: str) -> str:
    """``<model>-<target>-<precision>`` as one plain folder name (the bundle's folder on the board)."""
    stem = source.split(":")[-1] if ":" in source and not Path(source).exists() else Path(source).stem
    clean = re.sub(r"[^A-Za-z0-9._+-]+", "_", stem).strip("._-+") or "model"
    return f"{clean[:80]}-{target}-{precision}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def render_report(man: dict[str, Any], stats: ModelStats) -> str:
    v = man["verification"]
    lines = [
        f"# edgekit conversion report: {man['name']}",
        "",
        f"- source: `{man['source_model']['path']}` ({man['source_model']['kind']}, sha256 {man['source_model']['sha256'][:12]}…)",
        f"- target: **{man['target']}** ({man['format']}), precision **{man['precision']}**",
        f"- board: **{man['board']['id']}** — {man['board']['description']}",
        f"- verification: **{'PASSED' if v['passed'] else 'FAILED'}** with {v['runtime']} on {v['golden_samples']} golden samples from `{v['golden_source']}`",
        "",
        "## Host verification (artifact vs float model)",
        "",
        "| output | max abs error | max rel error | tolerance | top-1 agreement | result |",
        "|---|---|---|---|---|---|",
    ]
    for o in v["outputs"]:
        agree = "—" if o["top1_agreement"] is None else f"{o['top1_agreement']:.1%} (≥ {o['min_top1_agreement']:.0%})"
        lines.append(
            f"| {o['name']} | {o['max_abs_error']:.4g} | {o['max_rel_error']:.3%} | {o['tolerance_rel']:.2%} | {agree} | {'pass' if o['passed'] else 'FAIL'} |"
        )
    if v["float_accuracy"] is not None:
        drop = 100 * (v["float_accuracy"] - v["converted_accuracy"])
        lines += ["", f"Accuracy on {v['eval_samples']} eval samples: float **{v['float_accuracy']:.2%}**, "
                  f"{man['precision']} **{v['converted_accuracy']:.2%}** (drop {drop:.2f} points, "
                  f"tolerance {v['max_accuracy_drop_points']})."]
    if v["failures"]:
        lines += ["", "### Failures", ""] + [f"- {f}" for f in v["failures"]]
    a = man["analysis"]
    lines += [
        "",
        "## Model",
        "",
        f"- parameters: {a['params']:,} ({a['weight_params']:,} in conv/linear weights), MACs: {a['macs']:,}",
        "- weight bytes: " + ", ".join(f"{k} {_mb(b)}" for k, b in a["weight_bytes"].items()),
        f"- peak live activations: {_mb(a['peak_activation_bytes'])} (sum of all activations {_mb(a['total_activation_bytes'])})",
        f"- artifact: `{man['artifact']['primary']}` {_mb(man['files'][man['artifact']['primary']]['bytes']) if 'files' in man else ''}",
        "",
        "## Board budgets",
        "",
        f"- latency {man['budgets']['latency_ms']} ms, power {man['budgets']['power_w']} W, model RAM {man['budgets']['ram_mb']} MB",
        "- these are checked on the board by `python3 run.py` (smoke test); the host cannot measure them.",
    ]
    eng = man["artifact"].get("engine")
    if eng is not None and not eng.get("built"):
        lines += ["", "## TensorRT engine", "", f"Not built on this host: {eng['reason']}. On the board: `./build_engine.sh` "
                  "(trtexec from JetPack), then `python3 run.py`."]
    if man["warnings"] or man["notes"]:
        lines += ["", "## Warnings and notes", ""] + [f"- {w}" for w in man["warnings"] + man["notes"]]
    lines += ["", "## Stage times", "", ", ".join(f"{k} {t:.2f} s" for k, t in man["timings_s"].items()), ""]
    return "\n".join(lines)
