"""fp16 where fp16 holds: whether a Core ML fp16 program is fine as it is (``fp16_fits``), and where not, the
fewest ops of its fp32 version to leave in fp32 (``fp16_keep``), chosen by measurement with the host MIL
interpreter on calibration samples and judged as verification judges the outputs."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.coreml.mlprogram import coreml_names


# fp16's largest finite value is 65504; an op whose values reach a quarter of it on the calibration samples stays
# fp32: a power (|STFT|^2) of an input twice as loud as the loudest calibration sample is 4x larger, so a power
# spectrum within fp16 on calibration speech can overflow on louder held-out windows
FP16_LIMIT = 65504.0 / 4


FP16_MARGIN = 0.5  # the host's fp16 simulation (storage rounding) may use half the fp16 tolerance: Core ML's own
# fp16 arithmetic (accumulation, ANE) adds error the host cannot measure
MAX_FP32_OPS = 64  # more than this many ops in fp32 is not an fp16 program any more: left to verification


CHECK_SAMPLES = 16  # calibration samples the fp16 checks run on, at least (an LSTM's state drifts on some inputs only)
CHECK_SAMPLES_MAX = 64  # ... and at most, for a small program (an LSTM's state may drift on windows 16 miss)
CHECK_WORK = 1e7  # values one check pass may compute (samples x the program's activation values per sample)
SCREEN_FACTOR = 4  # the fp16 checks screen this many times their samples (one pass each) and keep the worst: fp16's
# error is not spread evenly (a near-tie in a softmax moves most), and evenly spread samples can miss the worst


def check_samples(fn) -> int:
    """How many calibration samples the fp16 checks run on: as many as CHECK_WORK activation values allow, from
    CHECK_SAMPLES to CHECK_SAMPLES_MAX (from the program's static shapes: the same count on every machine)."""
    work = 0
    for op in fn.operations:
        if op.op_type == "const":
            continue
        for v in op.outputs:
            shape = getattr(v, "shape", None) or ()
            if all(isinstance(d, (int, np.integer)) for d in shape):
                work += int(np.prod(shape)) if shape else 1
    return int(min(CHECK_SAMPLES_MAX, max(CHECK_SAMPLES, CHECK_WORK // max(1, work))))


def _feeds(job: ConvertJob, samples: int) -> list[dict[str, np.ndarray]]:
    """Calibration batches holding up to ``samples`` samples (else one batch of standard-normal inputs), keyed by
    Core ML names."""
    rn = coreml_names([s.name for s in job.model.inputs + job.model.outputs])
    if job.calib is not None:  # spread over the whole file (windows of one recording run from quiet to loud)
        bs = _batch(job)
        n = len(job.calib)
        idx = np.unique(np.linspace(0, n - 1, min(n, max(bs, samples - samples % bs))).astype(int))
        feeds = list(job.calib.subset(idx).batches(job.model))
    else:
        rng = np.random.default_rng(0)
        feeds = [{s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in job.model.inputs}]
    return [{rn[k]: v for k, v in f.items()} for f in feeds]


def _batch(job: ConvertJob) -> int:
    return max(1, job.model.batch)


def _judge(job: ConvertJob, ref: list[list[np.ndarray]], got: list[list[np.ndarray]], w8a8: bool = False
           ) -> dict[int, str]:
    """Failures of the fp16 outputs ``got`` against ``ref`` (per feed, per output), {output index: reason}, judged
    as verification judges them (each output's kind) with the fp16 tolerance times FP16_MARGIN (min SNR 6 dB
    higher). ``w8a8``: a W8A8 program against itself computed in fp32, with the int8 tolerance times FP16_MARGIN:
    fp16 rounding before an int8 quantize moves some values by a whole int8 step, which the fp16 tolerance would
    count as fp16's error."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    tol = (None if w8a8 else job.target.tolerances.get("fp16")) or job.target.tolerances[job.precision]
    tight = tol.model_dump()
    tight["max_rel_error"] *= FP16_MARGIN
    tight["max_error_decides"] = True  # a screen of fp16's numeric error: the values decide, not only the class
    if tight.get("min_snr_db") is not None:
        tight["min_snr_db"] += 6
    kinds = job.output_kinds
    failures = {}
    bs = _batch(job)
    refs, axes = smoke.merge_batches(ref, bs)
    gots = smoke.merge_batches(got, bs, axes)[0]
    for i, spec in enumerate(job.model.outputs):
        r, g = refs[i], gots[i]
        kind = kinds.get(spec.name) or smoke.infer_kind(r, len(job.model.outputs))
        bad = smoke.check_output(spec.name, kind, r, g, tight, "fp16 (host simulation)")["failures"]
        if bad:
            failures[i] = bad[0]
    return failures


def fp16_fits(job: ConvertJob, mlmodel, w8a8: bool = False) -> bool:
    """Whether an fp16 program is fine as it is, on CHECK_SAMPLES calibration samples: no value beyond fp16's range
    (FP16_LIMIT) and outputs within FP16_MARGIN of the fp16 tolerance of the float model, or (``w8a8``) of the
    same program run without fp16 rounding, by ``_judge``'s W8A8 rule (its int8 error is judged elsewhere). A
    program the host interpreter cannot run is taken as it is (verification says so)."""
    from edgekit.converters.coreml.interpreter import MILInterpreter

    prog = getattr(mlmodel, "_mil_program", None)
    if prog is None:
        return True
    try:
        interp = MILInterpreter(_dense_program(mlmodel) if w8a8 else prog)
    except Exception:  # noqa: BLE001 - an op the host interpreter lacks: nothing to measure here
        return True
    feeds = _feeds(job, SCREEN_FACTOR * check_samples(interp.fn))
    peaks: dict[str, float] = {}
    unrounded = [[o.numpy() for o in interp.run_tensors(f, True, peaks, None)] for f in feeds]
    if any(v > FP16_LIMIT for v in peaks.values()):
        return False
    # judged against the float model, as verification judges the package: the fp16 program run without rounding
    # still has fp16 weights and its input casts, whose error alone can take much of the tolerance
    ref = (None if w8a8 else _float_reference(job, feeds)) or unrounded
    return not _judge(job, ref, [interp(f) for f in feeds], w8a8=w8a8)


def _worst_first(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> list[int]:
    """Feed indices ordered by how far ``got`` strays from ``ref`` (the largest error of any output, relative to
    that output's range over all feeds), worst first."""
    n_out = len(ref[0])
    span = [max(float(np.ptp(np.concatenate([np.ravel(r[i]) for r in ref]))), 1e-12) for i in range(n_out)]
    score = [max(float(np.max(np.abs(np.asarray(g[i], np.float64) - r[i]), initial=0.0)) / span[i]
                 for i in range(n_out)) for r, g in zip(ref, got, strict=True)]
    return sorted(range(len(ref)), key=lambda k: -score[k])


def _dense_program(mlmodel) -> Any:
    """The MIL program with its compressed (int8) weights expanded, as the host interpreter runs it."""
    from coremltools.optimize.coreml import decompress_weights

    return decompress_weights(mlmodel)._mil_program


def _beyond_fp16(peaks: dict[str, float]) -> dict[str, str]:
    """The ops whose peak passes FP16_LIMIT, largest first, each with the reason it stays fp32."""
    return {k: f"values reach {v:.3g}" + (", beyond fp16's 65504" if v > 65504 else ", within 4x of fp16's 65504")
            for k, v in sorted(peaks.items(), key=lambda kv: -kv[1]) if v > FP16_LIMIT}


def _float_reference(job: ConvertJob, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]] | None:
    """The float model's outputs on feeds keyed by Core ML names (None where the reference cannot run them)."""
    back = {v: k for k, v in coreml_names([s.name for s in job.model.inputs + job.model.outputs]).items()}
    try:
        run = job.model.reference()
        return [[np.asarray(o, dtype=np.float32) for o in run({back[k]: v for k, v in f.items()})] for f in feeds]
    except Exception:  # noqa: BLE001 - the unrounded program is the reference then
        return None


def _in_vars(op) -> list:
    """The variables an op reads (list-valued inputs, such as concat's, flattened)."""
    return [var for v in op.inputs.values() for var in (v if isinstance(v, (list, tuple)) else [v])]


def _levels(start: list, step) -> dict[str, int]:
    """Breadth-first distance in ops from ``start`` (0), following ``step(op)`` (consts are not counted)."""
    dist: dict[str, int] = {}
    frontier, d = start, 0
    while frontier:
        nxt = []
        for op in frontier:
            if op.name in dist or op.op_type == "const":
                continue
            dist[op.name] = d
            nxt += step(op)
        frontier, d = nxt, d + 1
    return dist


def _distances(fn, outputs: list[str]) -> dict[str, int]:
    """Each op's distance in ops from the named outputs of a MIL function (0: the op that makes one)."""
    producer = {v.name: op for op in fn.operations for v in op.outputs}
    return _levels([producer[n] for n in outputs if n in producer],
                   lambda op: [producer[var.name] for var in _in_vars(op) if getattr(var, "name", None) in producer])


def _distances_from_inputs(fn, inputs: list[str]) -> dict[str, int]:
    """Each op's distance in ops from the inputs of a MIL function (0: an op that reads an input)."""
    readers: dict[str, list] = {}
    for op in fn.operations:
        for var in _in_vars(op):
            if getattr(var, "name", None) is not None:
                readers.setdefault(var.name, []).append(op)
    return _levels([op for n in inputs for op in readers.get(n, [])],
                   lambda op: [r for out in op.outputs for r in readers.get(out.name, [])])


def fp16_keep(job: ConvertJob, m32, w8a8: bool = False) -> dict[str, str]:
    """The ops of an fp32 program to keep fp32 in its fp16 version, each with the reason, measured on CHECK_SAMPLES
    calibration batches (edgekit's MIL interpreter on the fp32 program): the ones, of SCREEN_FACTOR times as many,
    whose outputs move most with every op in fp16 (the search's half: the worst of them):

    1. ops whose values in or out reach a quarter of fp16's range (FP16_LIMIT): kept, all of them;
    2. then, where the simulated fp16 program (those ops fp32, every other op's inputs, weights and outputs
       rounded to fp16) fails the fp16 tolerance times FP16_MARGIN on some outputs: the ops nearest those
       outputs (a softmax over a large vocabulary and the logits before it, the log of a spectrogram, an LSTM's
       state), the fewest levels that pass (doubling, then bisection; at most MAX_FP32_OPS ops), then each of
       them tried back in fp16 (farthest first) and left there where the outputs stay within tolerance.
       None pass: only (1); verification reports the error.

    ``w8a8``: ``m32`` is a W8A8 program (int8 weights expanded for the interpreter), judged against itself in fp32
    with the int8 tolerance (``_judge``)."""
    from edgekit.converters.coreml.interpreter import MILInterpreter

    t0 = time.perf_counter()
    interp = MILInterpreter(_dense_program(m32) if w8a8 else m32._mil_program)
    n = check_samples(interp.fn)
    feeds = _feeds(job, SCREEN_FACTOR * n)
    peaks: dict[str, float] = {}
    ref = [[o.numpy() for o in interp.run_tensors(f, True, peaks, None)] for f in feeds]
    keep = _beyond_fp16(peaks)
    float_ops = {op.name for op in interp.fn.operations if op.op_type != "const"}
    passes = [len(feeds)]
    if len(feeds) > n:  # screened: every op fp16 once on each feed, and the search measures the worst ones
        half = float_ops - set(keep)
        passes[0] += len(feeds)
        order = _worst_first(ref, [interp(f, half=half) for f in feeds])[:max(1, n // _batch(job))]
        feeds, ref = [feeds[k] for k in order], [ref[k] for k in order]

    def fails(names, n: int = len(feeds) // 2) -> dict[int, str]:  # the search runs on half the samples
        passes[0] += len(feeds[:n])
        half = float_ops - set(keep) - set(names)
        return _judge(job, ref[:n], [interp(f, half=half) for f in feeds[:n]], w8a8=w8a8)

    first = fails((), len(feeds))
    if not first:
        return keep

    def search(dist: dict[str, int]) -> list[str] | None:
        """The fewest distance levels (from the outputs, or from the inputs) whose ops kept fp32 pass."""
        levels = sorted(set(dist.values()))

        def within(d):
            return [k for k, v in sorted(dist.items(), key=lambda kv: kv[1]) if v <= d and k not in keep]

        lo, hi, d = -1, None, 0
        while hi is None and lo < levels[-1] and len(within(lo + 1)) <= MAX_FP32_OPS:
            d = min(d, levels[-1])
            if len(within(d)) > MAX_FP32_OPS or fails(within(d)):
                lo, d = d, 2 * d + 1
            else:
                hi = d
        if hi is None:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(within(mid)):
                lo = mid
            else:
                hi = mid
        chosen = within(hi)
        for name in sorted(chosen, key=lambda k: -dist[k])[:-1] if len(chosen) <= 12 else []:
            rest = [k for k in chosen if k != name]
            if not fails(rest):
                chosen = rest
        if fails(chosen, len(feeds)):  # confirmed on all the samples; else the search's margin was too thin
            chosen = within(hi)
        return chosen

    # the error is made near the outputs (a softmax over a large vocabulary, a log), or near the inputs (the input
    # rounded to fp16, the first layers' weights: a detector's boxes, a recogniser's probabilities)
    dist = _distances(interp.fn, [interp.output_names[i] for i in first])
    side = "an output"
    chosen = search(dist)
    if chosen is None:
        dist, side = _distances_from_inputs(interp.fn, interp.input_names), "an input"
        chosen = search(dist)
    if chosen is None:
        job.warn(f"fp16: keeping the {MAX_FP32_OPS} ops nearest the outputs, or the inputs, in fp32 does not bring "
                 f"the simulated fp16 program within tolerance ({next(iter(first.values()))}); only ops beyond "
                 "fp16's range are kept fp32")
        return keep
    kinds = {op.name: op.op_type for op in interp.fn.operations}
    for name in chosen:
        keep[name] = f"{kinds[name]} {dist[name]} op(s) from {side}: fp16 there moves the outputs too far"
    job.log(f"fp16 everywhere (host simulation): {next(iter(first.values()))}; {len(chosen)} op(s) kept fp32 bring "
            f"it within tolerance ({passes[0]} interpreter passes, {time.perf_counter() - t0:.1f} s)")
    return keep

