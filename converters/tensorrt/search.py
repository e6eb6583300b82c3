"""The mixed-precision layer search of an INT8 build: the Q/DQ nodes ranked by what their rounding costs, and a
builder that leaves the kept ones out of Q/DQ (TensorRT then runs them in fp16/fp32, as ``--int8 --fp16``
allows)."""

from __future__ import annotations

import json
import time

import numpy as np

from edgekit.converters import Artifact, ConvertJob
from edgekit.converters.tensorrt.calibration import calibrated_ranges
from edgekit.converters.tensorrt.qdq import QUANTIZED_OPS, TRT_QDQ_OPS, placement, run_model, write_qdq
from edgekit.converters.tensorrt.simulate import Simulation, method_ranges, simulation
from edgekit.deps import require
from edgekit.mixed.search import (Layer, Search, channel_energy, db, output_snr_db, quant_noise, search_feeds,
                                  weight_sqnr_db)

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ISOLATED_BUDGET_S = 60.0  # the search's measure of each node's rounding alone, at most this long
# ... on this many calibration samples (a ranking, not a verdict: the kept set is measured on the search samples
# and verified). ddddocr-det at 416x416: 83 nodes take 1.5 s each on 32 samples, so 60 s ranked 40 of them.
ISOLATED_SAMPLES = 8


def layer_search(job: ConvertJob, artifact: Artifact) -> Search:
    """The layers an INT8 build may keep out of quantization, ranked by the worse of their local quantization
    SQNR and the output SNR with only their rounding (_isolated_snr), and a builder for the search. The ranking
    measures at the output, so the search keeps the fewest ranked worst together (``by_rank``)."""
    onnx = require("onnx", "jetson")
    from onnx import helper

    pre = job.work_dir / "preprocessed.onnx"
    method = artifact.meta["quantization"]["calibration_method"]
    where = placement(job)
    quantized = set(TRT_QDQ_OPS) if where == "tensorrt" else QUANTIZED_OPS
    base_excluded = list(job.options.get("keep_float_nodes") or [])
    ranges_path = calibrated_ranges(job, pre, list(job.calib.batches(job.model)), method)
    ranges = require("onnxruntime.quantization.calibrate", "jetson").load_tensors_data(ranges_path)
    search = search_feeds(job)
    proto = onnx.load(str(pre))
    inits = {i.name: i for i in proto.graph.initializer}
    nodes = [n for n in proto.graph.node if n.op_type in quantized and n.name not in base_excluded]

    def rounded(n) -> list[str]:  # the tensors a node's Q/DQ rounds: its activation inputs, or its output
        if where == "tensorrt":
            return [t for t in n.input[:2] if t and t not in inits]
        return [n.output[0]] if n.output else []

    # one float run that also returns every node's output: its local INT8 SQNR at the calibrated range
    wanted = [t for n in nodes for t in rounded(n) if t in ranges.data]
    wanted += [t for n in nodes if n.op_type in WEIGHTED and n.input and n.input[0] not in inits
               for t in (n.input[0], n.output[0])]
    wanted = list(dict.fromkeys(wanted))
    vi = {v.name: v for v in list(proto.graph.value_info) + list(proto.graph.output)}
    known = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}  # inputs come from the feeds
    for t in wanted:
        if t not in known:
            proto.graph.output.append(vi.get(t) or helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    aug = job.work_dir / "mixed-augmented.onnx"
    onnx.save(proto, str(aug))
    import onnxruntime as ort

    sess = ort.InferenceSession(str(aug), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    # statistics summed batch by batch (a detector's every activation at once would not fit in memory)
    act = {n.name: [0.0, 0.0] for n in nodes}
    energy: dict[str, list] = {}
    for f in search[:8]:
        vals = {**f, **dict(zip(names, sess.run(names, f), strict=True))}
        for n in nodes:
            for t in rounded(n):
                if t in vals and t in ranges.data:
                    lo, hi = ranges.data[t].range_value
                    sig, noise = quant_noise(vals[t], float(np.max(np.abs([lo, hi]))))
                    act[n.name][0] += sig
                    act[n.name][1] += noise
            if n.op_type in WEIGHTED:
                for t in (n.input[0], n.output[0]):
                    if t in vals and np.ndim(vals[t]) >= 2:
                        x = vals[t]
                        x = x.reshape(-1, x.shape[-1]) if n.op_type in ("Gemm", "MatMul") else x
                        e, c = channel_energy(x)
                        acc = energy.setdefault(t, [np.zeros_like(e), 0])
                        if acc[0].shape == e.shape:
                            acc[0] += e
                            acc[1] += c
        del vals
    layers = []
    for n in nodes:
        scores = [db(*act[n.name])] if act[n.name] != [0.0, 0.0] else []
        w = next((inits[i] for i in n.input[1:2] if i in inits), None)
        if w is not None and n.op_type in WEIGHTED and n.input[0] in energy and n.output[0] in energy:
            arr = onnx.numpy_helper.to_array(w)
            groups = next((a.i for a in n.attribute if a.name == "group"), 1)
            if n.op_type == "ConvTranspose":
                arr = None  # its weight is [in, out/groups, ...]: not ranked by weights
            elif n.op_type == "MatMul" or (n.op_type == "Gemm" and not any(
                    a.name == "transB" and a.i for a in n.attribute)):
                arr = arr.T if arr.ndim == 2 else None  # [in, out] -> [out, in]
            e_in, e_out = energy[n.input[0]], energy[n.output[0]]
            if arr is not None and e_in[1] and e_out[1] and arr.shape[1] * groups == len(e_in[0]):
                scores.append(weight_sqnr_db(arr, e_in[0] / e_in[1], float(np.sum(e_out[0] / e_out[1])), groups))
        if scores:
            layers.append(Layer(n.name, n.op_type, round(float(min(scores)), 2)))
    # one simulated INT8 graph (simulate.py) serves every measure below: each node's rounding alone, and every
    # kept set the search asks for; only the set it keeps is built for real (keep_layers) and verified
    with job.substep("simulated INT8 graph"):
        sim = simulation(job, pre, ranges_path, method, base_excluded, where)
    sim.use_scales(method_ranges(ranges_path))
    ref = run_model(pre, search)  # the float model itself: its session optimizes what the simulated one cannot
    t0 = time.perf_counter()
    # and by what its rounding costs the output alone, through the layers after it (the worse of the two)
    # the locally worst first, where the budget ends early: a third of --search-budget (the whole search counts it)
    few = search_feeds(job, ISOLATED_SAMPLES)
    alone = _isolated_snr(sim, [lay.name for lay in sorted(layers, key=lambda x: x.local_sqnr_db)], few,
                          run_model(pre, few), min(ISOLATED_BUDGET_S, job.search_budget_s / 3))
    job.log(f"each node's rounding alone measured at the output: {len(alone)} of {len(layers)} nodes in "
            f"{time.perf_counter() - t0:.1f} s on {sum(len(next(iter(f.values()))) for f in few)} calibration "
            "samples (one simulated INT8 graph)")
    for lay in layers:
        if np.isfinite(alone.get(lay.name, np.inf)):
            lay.local_sqnr_db = round(float(min(lay.local_sqnr_db, alone[lay.name])), 2)
    step = iter(range(10**6))
    simulated: dict[str, float] = {}  # kept set -> simulated output SNR: the real build of the chosen set is held to it
    switched = set(sim.nodes)

    def outputs(kept: list[str]) -> list[np.ndarray]:
        if where == "tensorrt":  # each node's own Q/DQ pairs: the simulation is the build
            got = sim.run(search, quantized=switched - set(kept))
        else:  # qdq=all: a node's output pair is its consumers' input pair too; build it
            cand = job.work_dir / f"mixed-{next(step)}.onnx"
            write_qdq(pre, cand, ranges_path, method, base_excluded + kept, where)
            got = run_model(cand, search)
            cand.unlink()
        simulated[",".join(sorted(kept))] = output_snr_db(ref, got)
        _save_simulated(job, simulated, ref, where)
        return got

    return Search(layers, outputs, ref, "float (left out of Q/DQ; TensorRT runs it in fp16 under --fp16)",
                  by_rank=bool(alone))


SIMULATED = "simulated-scores.json"  # the work folder's record of the kept sets the simulation measured
SIMULATED_REF = "simulated-reference.npz"  # ... and the float outputs they were measured against


def _save_simulated(job: ConvertJob, simulated: dict[str, float], ref: list[np.ndarray], where: str) -> None:
    path = job.work_dir / SIMULATED
    if not (job.work_dir / SIMULATED_REF).is_file():
        np.savez(job.work_dir / SIMULATED_REF, *ref)
    path.write_text(json.dumps({"simulated": where == "tensorrt", "snr_db": simulated}))


def simulated_vs_real(job: ConvertJob, artifact: Artifact, kept: list[str]) -> dict | None:
    """For a build with ``kept`` nodes float that the search measured: its output SNR on the search samples as the
    simulated graph measured it and as the real Q/DQ model (``artifact``) gives it; None where the search did
    not measure this set (its scores came from the sensitivity cache)."""
    try:
        rec = json.loads((job.work_dir / SIMULATED).read_text())
        with np.load(job.work_dir / SIMULATED_REF) as z:
            ref = [z[f"arr_{i}"] for i in range(len(z.files))]
    except (OSError, ValueError):
        return None
    sim = rec["snr_db"].get(",".join(sorted(kept)))
    if sim is None:
        return None
    real = output_snr_db(ref, run_model(job.out_dir / artifact.primary, search_feeds(job)))
    return {"kept": len(kept), "simulated_snr_db": _num(sim), "real_snr_db": _num(real),
            "difference_db": (0.0 if real == sim else _num(real - sim) if np.isfinite(real) and np.isfinite(sim)
                              else None),
            "simulated": bool(rec["simulated"])}


def _num(x: float) -> float | str:
    return round(float(x), 3) if np.isfinite(x) else str(x)


def _isolated_snr(sim: Simulation, nodes: list[str], search: list, ref: list[np.ndarray],
                  budget_s: float = ISOLATED_BUDGET_S) -> dict[str, float]:
    """Per node named in ``nodes``: the output SNR against float (dB) on ``search`` with only that node's inputs
    rounded (its activations at their calibrated ranges, its int8 weights), every other node reading the float
    values its Q/DQ pairs stand for: the simulated graph with only that node switched on. It sees what a node's
    rounding costs the output through the layers after it, which its local SNR does not: a first convolution's
    input rounding, amplified downstream (the jetson analogue of the 16x8 search's weight effect in the tflite
    converter). Nodes are measured in the order given until ``budget_s`` is spent (one run of the simulated
    graph's session each); the rest are left out of the result."""
    out: dict[str, float] = {}
    switchable = set(sim.nodes)
    t0 = time.perf_counter()
    for name in nodes:
        if name not in switchable:
            continue
        if time.perf_counter() - t0 > budget_s:
            break
        out[name] = output_snr_db(ref, sim.run(search, quantized=[name]))
    return out
