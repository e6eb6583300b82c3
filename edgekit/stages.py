"""The convert pipeline's stages: each a function from typed records to a typed record.

    ingest   -> Ingested      the model (edgekit.ingest.Model) and its calibration / eval data
    analyze  -> Analysis      ModelStats and the float graph; the op-support check
    plan     -> Planned       the precision (the budget planner's choice for ``auto``) and its estimate
    data     -> Prepared      the data every converter and the checks share: calibration data checked, golden
                              (and eval) samples drawn and held out of it, each output's kind
    convert  -> Artifact      the converter (edgekit.converters) writes the target's format (and compresses it)
    verify   -> Checked       Verification and the golden inputs/outputs, with the host runtime
    mixed    -> Artifact, Checked   an INT8 build that failed verification: its mixed-precision fallback
                              (edgekit.mixed.fallback), verified again; no-op otherwise or with --strict
    write    -> manifest      golden.npz, runner, report.md, manifest.json (edgekit.manifest.Manifest)

``STAGES`` declares the order; each stage names the records it needs and gives, and
:func:`check_order` checks a stage list against that before anything runs. Quantization
itself is per toolchain (onnxruntime Q/DQ, the PT2E quantizer, coremltools, brevitas) and stays
in each converter; pruning is the planner's (edgekit.prune, used by edgekit.refine).
"""

from __future__ import annotations

import json
import platform
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from edgekit import __version__
from edgekit.analyze import ModelStats, analyze_model
from edgekit.carry import Carry, carried_check, golden_sequence, make_carry, run_pair_carried, with_states
from edgekit.carry import summary as carried_summary
from edgekit.converters import Artifact, ConvertJob, Runner, converter_info, flag_option
from edgekit.data import Dataset, draw, load_npz, random_dataset
from edgekit.errors import InputSpecError, ProfileError, UnsupportedOpError
from edgekit.fsutil import data_dir, sha256_file
from edgekit.ingest import Model, check_target_takes, for_converter, load_model, source_kind
from edgekit.lineage import against_original, finetuned, student_reference  # noqa: F401 - the pipeline's stages
from edgekit.manifest import SCHEMA_VERSION, Manifest
from edgekit.planner import Budgets, Plan, plan_section
from edgekit.profiles import Board, Target, Tolerance
from edgekit.report_md import render_report
from edgekit.verify import Verification, infer_kinds, pick_eval_output
from edgekit.verify import verify as verify_outputs

GOLDEN_FILE = "golden.npz"
GOLDEN_SEED = 0
GOLDEN_DEFAULT = 64  # enough that one class the build gets wrong shows (64 of 10 classes: at least 1 each)


@dataclass(frozen=True)
class Stage:
    name: str
    needs: tuple[str, ...]  # records that must exist before it runs
    gives: tuple[str, ...]  # records it adds


# The order is data: a stage list is checked against it (check_order) before anything runs.
STAGES: tuple[Stage, ...] = (
    Stage("ingest", (), ("ingested",)),
    Stage("analyze", ("ingested",), ("analysis",)),
    Stage("plan", ("ingested", "analysis"), ("planned",)),
    Stage("data", ("ingested", "planned"), ("prepared",)),
    Stage("convert", ("ingested", "analysis", "planned", "prepared"), ("artifact",)),
    Stage("verify", ("ingested", "planned", "prepared", "artifact"), ("checked",)),
    Stage("mixed", ("planned", "prepared", "artifact", "checked"), ("artifact", "checked")),
    Stage("speed", ("planned", "artifact", "checked"), ("checked",)),
    Stage("write", ("ingested", "analysis", "planned", "prepared", "artifact", "checked"), ("manifest",)),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def check_order(names: list[str] | tuple[str, ...]) -> None:
    """Every stage's inputs are given by an earlier stage; raises ValueError (a bug) otherwise."""
    by_name = {s.name: s for s in STAGES}
    have: set[str] = set()
    for n in names:
        if n not in by_name:
            raise ValueError(f"unknown stage {n!r}")
        missing = set(by_name[n].needs) - have
        if missing:
            raise ValueError(f"stage {n!r} needs {sorted(missing)}, which no earlier stage gives")
        have |= set(by_name[n].gives)


@dataclass
class Ingested:
    model: Model
    calib: Dataset | None
    eval: Dataset | None
    carry: Carry | None = None  # --carry: states carried from chunk to chunk (edgekit.carry)


@dataclass
class Analysis:
    stats: ModelStats
    float_graph: Path | None


@dataclass
class Planned:
    precision: str
    plan: Plan | None  # the planner's choice when the precision was "auto"
    section: dict[str, Any] | None  # the manifest's ``plan``: the cost-model estimate of this build


@dataclass
class Prepared:
    calib: Dataset | None  # checked calibration data (int8), or None; golden/eval samples held out of it
    golden: Dataset  # the golden samples, drawn across --eval, else --calib, else random inputs
    eval: Dataset | None  # the eval samples (all of --eval; the held-out part when it is the --calib file)
    record: dict[str, Any]  # how the golden samples were drawn: the manifest's golden.selection
    kinds: dict[str, str]  # output name -> class | regression | mask | index
    eval_output: int | None  # the output --eval labels are scored on


@dataclass
class Checked:
    verification: Verification
    golden_inputs: dict[str, np.ndarray]
    golden_outputs: list[np.ndarray]


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


def _source_kind(m: Model) -> str:
    """The kind of the file the user gave (a bridged model converts as ONNX / torch, but came as Keras or ONNX)."""
    if (m.bridge or "").startswith("tf2onnx"):
        return source_kind(m.source) or "keras"
    return "onnx" if m.onnx_prep is not None else m.kind


def check_calibration(precision: str, given: bool) -> None:
    if precision == "int8" and not given:
        raise InputSpecError(
            "INT8 needs calibration data: give --calib FILE.npz (a few hundred real inputs), "
            "or --calib random to accept unknown accuracy"
        )


# ---------------------------------------------------------------- the stages


def ingest(model: str | Path | Model, target: Target, input_shape: list[str] | None, trust_pickle: bool,
           calib: str | None, eval_data: str | None, max_data_mb: float | None,
           consts: list[str] | None = None, keras_via_onnx: bool = False,
           batch_axes: list[str] | None = None, carries: list[str] | None = None,
           sequence_length: int | None = None) -> Ingested:
    """ingest: the model (refused early when the target does not take its kind) and its data files. An ONNX
    model for a converter that reads torch is bridged here (edgekit.onnx_bridge), checked against onnxruntime.
    With ``--carry`` the data files need no array for a carried state: each chunk takes the state the float
    model handed back after the chunk before it (edgekit.carry.with_states)."""
    check_target_takes(model, target)  # Keras / SavedModel / ONNX: refused by name before loading a framework
    m = model if isinstance(model, Model) else load_model(model, input_shape, trust_pickle, consts, batch_axes)
    m = for_converter(m, target, keras_via_onnx)
    carry = make_carry(m, carries, sequence_length)
    states = carry.inputs if carry else frozenset()
    calib_ds = random_dataset(m) if calib == "random" else (
        load_npz(calib, m, what="--calib", max_mb=max_data_mb, generated=states) if calib else None)
    # labels are optional: without them --eval measures agreement with the float model on every sample
    eval_ds = load_npz(eval_data, m, what="--eval", max_mb=max_data_mb, generated=states) if eval_data else None
    if carry:
        calib_ds, eval_ds = (None if d is None else with_states(m, d, carry) for d in (calib_ds, eval_ds))
    return Ingested(m, calib_ds, eval_ds, carry)


def analyze(ing: Ingested, target: Target, work: Path, opset: int | None, options: dict[str, Any] | None,
            warn: Callable[[str], None], given: tuple[ModelStats, Path] | None = None,
            precision: str | None = None) -> Analysis:
    """analyze: per-layer stats and the float graph (torch -> ONNX, ONNX as given, Keras -> fp32 .tflite), and
    the op-support check against the target (refused here, or kept float where the converter allows it)."""
    stats, graph = given if given is not None else analyze_model(ing.model, work, target, opset)
    refusal = op_refusal(stats, target, options, warn, None if precision == "auto" else precision)
    if refusal:
        raise UnsupportedOpError(refusal)
    return Analysis(stats, graph)


def op_refusal(stats: ModelStats, target: Target, options: dict[str, Any] | None,
               warn: Callable[[str], None] = lambda m: None, precision: str | None = None) -> str | None:
    """Why the target refuses the analyzed model's ops (None: it takes them). The one check behind both
    convert's analyze stage and ``edgekit inspect --target``, so inspect predicts convert's refusal.
    A target's op list may hold for some precisions only (``ops_precisions``: android's is its int8
    kernels): at another precision it does not apply; with the precision unknown (auto) it is checked."""
    if not stats.unsupported:
        return None
    if precision is not None and target.ops_precisions is not None and precision not in target.ops_precisions:
        return None
    listed = ", ".join(f"{u['op']} (node {u['node']})" for u in stats.unsupported[:10])
    if flag_option(options, "allow_float_fallback"):
        warn(f"{len(stats.unsupported)} op(s) outside target {target.name}'s list kept (allow_float_fallback): "
             + listed)
        return None
    fix = "replace them in the model or choose another target"
    if converter_info(target.converter).float_fallback:  # such ops can stay float (audited after converting)
        fix += ", or pass --option allow_float_fallback=true to keep them float"
    at = f" at {', '.join(target.ops_precisions)}" if target.ops_precisions else ""
    if target.ops_precisions:
        fix += f", or choose --precision {next(p for p in target.precisions if p not in target.ops_precisions)}"
    reasons = {**target.missing_ops, **target.converter_gaps}
    gaps = {u["op"] for u in stats.unsupported if u["op"] in reasons}
    if gaps:  # say whose limitation it is: the target's toolchain (missing_ops) or edgekit's (converter_gaps)
        own = [u for u in stats.unsupported if u["op"] not in gaps]
        why = "; ".join(f"{op} (node {', '.join(u['node'] for u in stats.unsupported if u['op'] == op)[:120]}): "
                        f"{reasons[op]}" for op in sorted(gaps))
        head = (f"target {target.name} cannot run {len(own)} op(s){at}: "
                + ", ".join(f"{u['op']} (node {u['node']})" for u in own[:10]) + "; ") if own else ""
        return f"{head}{why}; {fix}"
    return f"target {target.name} cannot run {len(stats.unsupported)} op(s){at}: {listed}; {fix}"


def plan(ing: Ingested, an: Analysis, target: Target, board: Board, precision: str,
         log: Callable[[str], None], options: dict[str, Any] | None = None) -> Planned:
    """plan: the precision; for ``auto`` the budget-driven planner picks it from the analysis."""
    chosen = None
    if precision == "auto":
        from edgekit.planner import choose

        chosen = choose(ing.model, board, target, stats=an.stats, prunable=False)
        precision = chosen.precision
        log(f"plan: {chosen.reason}")
        refusal = op_refusal(an.stats, target, options, log, precision) if target.ops_precisions else None
        if refusal:
            raise UnsupportedOpError(refusal)
    check_precision(precision, target, board)
    return Planned(precision, chosen, plan_section(an.stats, board, precision, chosen))


def held_out(n: int, labels: np.ndarray | None, golden: np.ndarray) -> np.ndarray:
    """The samples of a file that is both --calib and --eval which only check, never calibrate: the golden ones
    and a quarter of the file (at least as many as the golden ones), sorted. bench/accuracy.py fine-tunes on the
    rest, so the agreement it reports is held out of training too."""
    return np.union1d(golden, draw(n, max(len(golden), n // 4), labels, seed=GOLDEN_SEED + 1))


def data(ing: Ingested, planned: Planned, golden_count: int, warn: Callable[[str], None],
         output_kinds: dict[str, str] | None = None, eval_output: str | None = None) -> Prepared:
    """data: what every converter and the checks need before anything is quantized: calibration data for INT8
    (real, or random with a warning), the golden (and eval) samples drawn and held out of it, and each output's
    kind (the metric that judges it). Compression itself is each converter's."""
    calib_ds = ing.calib
    if planned.precision == "int8":
        check_calibration(planned.precision, calib_ds is not None)
        if calib_ds is not None and calib_ds.random:
            warn("--calib random: INT8 ranges come from random inputs; accuracy on real data is unknown")
    eval_ds = ing.eval
    if ing.carry is not None:
        return _carried_data(ing, calib_ds, eval_ds, golden_count, warn, output_kinds, eval_output)
    src = eval_ds or calib_ds or random_dataset(ing.model, n=golden_count)
    idx = draw(len(src), golden_count, src.labels, seed=GOLDEN_SEED)
    record: dict[str, Any] = {"seed": GOLDEN_SEED, "from": "eval" if eval_ds else ("calib" if calib_ds else "random"),
                              "stratified": src.labels is not None, "indices": [int(i) for i in idx],
                              "held_out_of_calibration": 0}
    if calib_ds is not None and not calib_ds.random and _same_file(calib_ds, eval_ds if eval_ds else calib_ds):
        # one file for calibration and checking: the checked samples never calibrate
        held = idx
        if eval_ds is not None:  # --eval is the --calib file: a quarter of it (at least the golden set) is held out
            held = held_out(len(src), src.labels, idx)
            eval_ds = src.subset(held)
            idx = np.searchsorted(held, idx)
            record["indices_in"] = "the held-out eval samples"
        rest = np.setdiff1d(np.arange(len(calib_ds)), held)
        bs = ing.model.batch
        if len(rest) >= bs:
            calib_ds = calib_ds.subset(rest)
            record["held_out_of_calibration"] = int(len(held))
        else:
            warn(f"{calib_ds.source} has only {len(calib_ds)} samples: the golden samples also calibrate; "
                 "give more data, or a separate --eval file")
    golden = (eval_ds if eval_ds is not None and "indices_in" in record else src).subset(idx)
    return _prepared(ing, calib_ds, golden, eval_ds, record, output_kinds, eval_output)


def _carried_data(ing: Ingested, calib_ds: Dataset | None, eval_ds: Dataset | None, golden_count: int,
                  warn: Callable[[str], None], output_kinds: dict[str, str] | None,
                  eval_output: str | None) -> Prepared:
    """The data stage with ``--carry``: the golden samples are a sequence, in order (edgekit.carry.golden_sequence:
    the first ``--golden`` chunks of the last sequence of the eval file, else the calibration file), held out of
    calibration; a file that is both --calib and --eval checks on that sequence only."""
    carry = ing.carry
    for d, flag in ((calib_ds, "--calib"), (eval_ds, "--eval")):
        if d is not None and d.unused:
            warn(f"--carry: {flag} {d.source}: array(s) {', '.join(d.unused)} not used: each chunk takes the state "
                 "the float model handed back after the chunk before it")
    src = eval_ds or calib_ds or with_states(ing.model, random_dataset(ing.model, n=golden_count), carry)
    idx = golden_sequence(len(src), golden_count, carry)
    record: dict[str, Any] = {"from": "eval" if eval_ds else ("calib" if calib_ds else "random"),
                              "sequence": [int(idx[0]), int(idx[-1]) + 1], "in_order": True,
                              "held_out_of_calibration": 0}
    golden = src.subset(idx)
    if calib_ds is not None and not calib_ds.random and _same_file(calib_ds, src):
        if eval_ds is not None:  # --eval is the --calib file: it checks on the held-out sequence
            eval_ds = golden
        rest = np.setdiff1d(np.arange(len(calib_ds)), idx)
        if len(rest) >= ing.model.batch:
            calib_ds = calib_ds.subset(rest)  # their states stay those of the whole sequence
            record["held_out_of_calibration"] = len(idx)
        else:
            warn(f"{calib_ds.source} has only {len(calib_ds)} chunks: the golden chunks also calibrate; "
                 "give more data, or a separate --eval file")
    return _prepared(ing, calib_ds, golden, eval_ds, record, output_kinds, eval_output)


def _prepared(ing: Ingested, calib_ds: Dataset | None, golden: Dataset, eval_ds: Dataset | None,
              record: dict[str, Any], output_kinds: dict[str, str] | None, eval_output: str | None) -> Prepared:
    """The data stage's end, with or without --carry: each output's kind (what metric judges it) and the output
    labels are scored on, settled before converting."""
    kinds = infer_kinds(ing.model, ing.model.reference(), golden, output_kinds)
    scored = None
    if eval_ds is not None and eval_ds.labels is not None:
        scored = pick_eval_output(ing.model, kinds, eval_output)
    elif eval_output is not None:
        raise InputSpecError(f"--eval-output {eval_output}: give --eval with a 'label' array to score it")
    return Prepared(calib_ds, golden, eval_ds, record, kinds, scored)


def _same_file(a: Dataset, b: Dataset) -> bool:
    from edgekit.fsutil import same_file

    return a is b or same_file(a.source, b.source)


def convert(job: ConvertJob, converter: Any) -> Artifact:
    """convert: the target's converter writes its artifact into the (temporary) output folder."""
    return converter.convert(job)


def verify(ing: Ingested, make_runner: Callable[[], Runner], prep: Prepared, tol: Tolerance, runtime: str,
           precision: str, reference: tuple[Callable, str] | None = None) -> Checked:
    """verify: first load the artifact in the host runtime and run it once (a failure there is the build's
    failure, named with the runtime's own message: the build is kept and marked failed); then compare it with
    the float model on golden (and eval) data: the model given, or ``reference`` (its runner and source; see
    :func:`original_reference`)."""
    m = ing.model
    run_ref = reference[0] if reference else m.reference()
    feeds = list(prep.golden.batches(m, len(prep.golden)))
    try:
        runner = make_runner()
        runner(feeds[0])
    except Exception as exc:  # noqa: BLE001 - every runtime raises its own types for an artifact it cannot load
        from edgekit.quiet import first_line
        from edgekit.verify import run_all, samples_first

        ref = run_all(run_ref, feeds, m)
        gin = samples_first(m, feeds)
        v = Verification(runtime, precision, len(ref[0]), prep.golden.source, [], failures=[
            f"the artifact does not load or run in {runtime} ({type(exc).__name__}: {first_line(exc, 300)})"])
    else:
        carry = ing.carry
        eval_pair = None if carry is None else (  # each model over every eval sequence with its own state
            lambda ref_run, art_run, ds: run_pair_carried(m, carry, ref_run, art_run, ds))
        v, gin, ref = verify_outputs(m, run_ref, runner, prep.golden, len(prep.golden), tol, runtime, precision,
                                     prep.eval, prep.kinds, prep.eval_output, eval_pair)
        if carry is not None:  # and over the golden sequence, each model carrying its own state
            v.carried, failures = carried_check(m, carry, run_ref, runner, prep.golden, prep.kinds, tol.model_dump(),
                                                precision)
            v.failures += failures
            v.notes.append(carried_summary(v.carried))
    if reference:
        v.reference_model = reference[1]
        v.notes.append(f"checked against the float model it was fine-tuned from ({reference[1]}), not its own float "
                       "weights: the build imposes the activation ranges its student trained with to imitate that "
                       "model (--option student_ranges=off checks against its own)")
    return Checked(v, gin, ref)


def mixed(job: ConvertJob, converter: Any, artifact: Artifact, checked: Checked, prep: Prepared, tol: Tolerance,
          reverify: Callable[[Artifact], Checked], strict: bool, log: Callable[[str], None],
          warn: Callable[[str], None], step: Callable[[str, str], None] = lambda n, m: None,
          scores: Path | None = None) -> tuple[Artifact, Checked]:
    """mixed: an INT8 build that failed verification (unless ``strict``) gets the mixed-precision fallback
    (edgekit.mixed.fallback: the fewest sensitive layers kept at higher precision, verified again with
    ``reverify``), driven by what the registry declares the converter offers (``ConverterInfo.mixed``). Any other
    build passes through as verified. ``step``: the search's sub-steps (progress, time left); ``scores``: the cache
    folder holding sensitivity scores (edgekit.mixed.scores; None: not cached)."""
    offers = converter_info(job.target.converter).mixed
    v = checked.verification
    if v.passed or not v.outputs or strict or job.precision != "int8" or not offers:
        return artifact, checked
    from edgekit.mixed.fallback import fallback

    return fallback(job, converter, artifact, checked, prep.kinds, tol, reverify, log, warn, offers=offers,
                    progress=step, scores=scores)


def speed(job: ConvertJob, converter: Any, artifact: Artifact, checked: Checked,
          warn: Callable[[str], None]) -> None:
    """speed: an INT8 build (the one the mixed stage ends with) timed against the same model's float build on the
    target's host runtime, where the registry declares the converter can (``ConverterInfo.speed``,
    :mod:`edgekit.speed`): the timing goes into the artifact's meta and notes, and a slower INT8 build fails
    verification unless ``job.allow_slower_int8``. A build that did not load is not timed."""
    v = checked.verification
    if job.precision != "int8" or not converter_info(job.target.converter).speed or not v.outputs:
        return
    from edgekit.speed import verdict

    timed = converter.host_speed(job, artifact)  # declared (capabilities.HostSpeed; the contract test checks it)
    if timed is None:
        return
    artifact.meta["speed"] = timed.to_json()
    artifact.notes.append(timed.line(job.precision))  # the CLI prints it from the manifest (artifact.speed)
    if not timed.judged:
        artifact.notes.append(f"speed not judged against float: {timed.not_judged}")
    failure = verdict(timed, job.precision, job.allow_slower_int8)
    if failure:
        v.failures.append(failure)
    elif timed.slower and timed.estimated:
        warn(f"the cost model estimates the INT8 build {1 / timed.speedup:.2f}x slower than the "
             f"{timed.float_precision} build on {timed.runtime} ({timed.kernels}); time both on the board before "
             "shipping it")
    elif timed.slower and timed.judged:
        warn(f"the INT8 build runs {1 / timed.speedup:.2f}x slower than fp32 on {timed.runtime}; accepted by "
             "--allow-slower-int8")


def write(out: Path, m: Model, tgt: Target, brd: Board, precision: str, artifact: Artifact, checked: Checked,
          calib_ds: Dataset | None, stats: ModelStats, versions: dict[str, Any], warnings: list[str],
          times: dict[str, float], plan: dict[str, Any] | None = None,
          selection: dict[str, Any] | None = None, carry: Carry | None = None) -> dict[str, Any]:
    """write: golden.npz, the device runner, report.md and manifest.json into the (temporary) output folder."""
    verification, golden_in, golden_out = checked.verification, checked.golden_inputs, checked.golden_outputs
    arrays: dict[str, np.ndarray] = {}
    g_inputs, g_outputs = [], []
    for i, spec in enumerate(m.inputs):
        arrays[f"input_{i}"] = golden_in[spec.name]
        g_inputs.append({"name": spec.name, "key": f"input_{i}", "shape": list(spec.shape), "dtype": spec.dtype,
                         # the golden array holds samples first; the board moves them to this axis of the input
                         **({"batch_axis": "none" if spec.batch_axis is None else spec.batch_axis}
                            if spec.batch_axis != 0 else {})})
    for i, (spec, arr) in enumerate(zip(m.outputs, golden_out, strict=True)):
        arrays[f"output_{i}"] = arr
        g_outputs.append({"name": spec.name, "key": f"output_{i}", "shape": list(arr.shape[1:]), "dtype": str(arr.dtype),
                          "kind": next((o.kind for o in verification.outputs if o.name == spec.name), None),
                          # the axis of the model's own output that holds the batch: the board merges its runs on it
                          "batch_axis": next((o.batch_axis for o in verification.outputs if o.name == spec.name), 0)})
    renamed = artifact.meta.get("io_names") or {}  # a format that renamed the model's inputs / outputs
    for g in g_inputs + g_outputs:
        if renamed.get(g["name"], g["name"]) != g["name"]:
            g["runtime_name"] = renamed[g["name"]]
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
        "source_model": {"path": m.source, "kind": _source_kind(m), "sha256": m.sha256,
                         **({"prepared": m.onnx_prep.steps, "consts": m.onnx_prep.consts or None, "bridge": m.bridge}
                            if m.onnx_prep is not None else {}), **finetuned(m)},
        "inputs": [s.to_json() for s in m.inputs],
        "outputs": [s.to_json() for s in m.outputs],
        "calibration": None if calib_ds is None else {
            "source": calib_ds.source, "random": calib_ds.random, "samples": len(calib_ds),
            "sha256": None if calib_ds.random else sha256_file(Path(calib_ds.source)),
            "used_for": "int8 ranges" if precision == "int8" else "golden inputs only",
        },
        **({"carry": carry.to_json()} if carry is not None else {}),
        "artifact": {"primary": artifact.primary, "format": artifact.format, **artifact.meta},
        "toolchain": {"edgekit": __version__, **versions},
        "budgets": budget_record(brd, plan),
        "golden": {"file": GOLDEN_FILE, "samples": int(next(iter(golden_in.values())).shape[0]),
                   "source": verification.golden_source, "inputs": g_inputs, "outputs": g_outputs,
                   "selection": selection},
        "tolerance": tol.model_dump(),
        "analysis": {k: v for k, v in stats.to_json().items() if k != "layers"},
        "verification": verification.to_json(),
        "runner": {"entry": "run.py", "files": sorted(runner_files)},
        "timings_s": {k: round(v, 3) for k, v in times.items()},
        "plan": plan,  # cost-model estimate of this build (edgekit.planner); read back to recalibrate
        "warnings": warnings,
        "notes": artifact.notes + verification.notes,
    }
    # the files so far (the report gives the artifact's size); hashed with the report and all below
    manifest["files"] = {p.relative_to(out).as_posix(): {"bytes": p.stat().st_size}
                         for p in out.rglob("*") if p.is_file()}
    (out / "report.md").write_text(render_report(manifest, stats))
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest["files"] = {
        p.relative_to(out).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files
    }
    record = Manifest.model_validate(manifest)  # the one schema, checked on the writing side too
    manifest = record.to_json()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest




def budget_record(brd: Board, plan: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest's budgets: the plan's own figures (one set of numbers for plan, report and smoke test);
    ``ram_mb`` is the whole process, ``runtime_overhead_mb`` of it the runtime's own."""
    b = (plan or {}).get("budgets") or Budgets.for_board(brd).to_json()
    return {**{k: b.get(k) for k in ("latency_ms", "power_w", "ram_mb", "storage_mb", "energy_mj")},
            "runtime_overhead_mb": brd.runtime_overhead_mb}


def bundle_name(source: str, target: str, precision: str) -> str:
    """``<model>-<target>-<precision>`` as one plain folder name (the bundle's folder on the board)."""
    stem = source.split(":")[-1] if ":" in source and not Path(source).exists() else Path(source).stem
    clean = re.sub(r"[^A-Za-z0-9._+-]+", "_", stem).strip("._-+") or "model"
    return f"{clean[:80]}-{target}-{precision}"
