"""The mixed-precision layer search of an INT8 build: the Q/DQ nodes ranked by what their rounding costs, and a
builder that leaves the kept ones out of Q/DQ (TensorRT then runs them in fp16/fp32, as ``--int8 --fp16``
allows)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edgekit.converters import Artifact, ConvertJob
from edgekit.converters.tensorrt.calibration import calibrated_ranges
from edgekit.converters.tensorrt.qdq import QUANTIZED_OPS, TRT_QDQ_OPS, placement, run_model, write_qdq
from edgekit.deps import require
from edgekit.mixed.search import (Layer, Search, channel_energy, db, output_snr_db, quant_noise, search_feeds,
                                  weight_sqnr_db)

WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ISOLATED_BUDGET_S = 60.0  # the search's measure of each node's rounding alone, at most this long


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
    ref = run_model(pre, search)
    # and by what its rounding costs the output alone, through the layers after it (the worse of the two)
    full = job.work_dir / "mixed-all.onnx"
    write_qdq(pre, full, ranges_path, method, base_excluded, where)
    t0 = time.perf_counter()
    # the locally worst first, where the budget ends early: a third of --search-budget (the whole search counts it)
    alone = _isolated_snr(pre, full, [lay.name for lay in sorted(layers, key=lambda x: x.local_sqnr_db)],
                          search, ref, job.work_dir, min(ISOLATED_BUDGET_S, job.search_budget_s / 3))
    full.unlink()
    job.log(f"each node's rounding alone measured at the output: {len(alone)} of {len(layers)} nodes in "
            f"{time.perf_counter() - t0:.1f} s")
    for lay in layers:
        if np.isfinite(alone.get(lay.name, np.inf)):
            lay.local_sqnr_db = round(float(min(lay.local_sqnr_db, alone[lay.name])), 2)
    step = iter(range(10**6))

    def outputs(kept: list[str]) -> list[np.ndarray]:
        cand = job.work_dir / f"mixed-{next(step)}.onnx"
        write_qdq(pre, cand, ranges_path, method, base_excluded + kept, where)
        got = run_model(cand, search)
        cand.unlink()
        return got

    return Search(layers, outputs, ref, "float (left out of Q/DQ; TensorRT runs it in fp16 under --fp16)",
                  by_rank=bool(alone))


def _isolated_snr(pre: Path, full: Path, nodes: list[str], search: list, ref: list[np.ndarray], work: Path,
                  budget_s: float = ISOLATED_BUDGET_S) -> dict[str, float]:
    """Per node named in ``nodes``: the output SNR against float (dB) on ``search`` of the INT8 build ``full`` with
    only that node's inputs rounded (its activations at their calibrated ranges, its int8 weights), every other
    node reading the float values its Q/DQ pairs stand for (``pre``'s inputs of the node of the same name). It
    sees what a node's rounding costs the output through the layers after it, which its local SQNR does not: a
    first convolution's input rounding, amplified downstream (the jetson analogue of the 16x8 search's
    weight effect in the tflite converter). Nodes are measured in the order given until ``budget_s`` is spent (one
    onnxruntime session and run each); the rest are left out of the result."""
    onnx = require("onnx", "jetson")

    proto = onnx.load(str(full))
    base = onnx.load(str(pre))
    originals = {n.name: list(n.input) for n in base.graph.node}
    dequantized = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    have = {i.name for i in proto.graph.initializer}
    floats = {i.name: i for i in base.graph.initializer if i.name not in have}  # the weights Q/DQ replaced
    rewire = {}  # node index -> its inputs with each dequantized one replaced by the float tensor it stands for
    for k, n in enumerate(proto.graph.node):
        orig = originals.get(n.name)
        if orig is not None and len(orig) == len(n.input) and any(t in dequantized for t in n.input):
            rewire[k] = [o if t in dequantized else t for t, o in zip(n.input, orig, strict=True)]
    index = {n.name: k for k, n in enumerate(proto.graph.node) if k in rewire}
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for name in nodes:
        k = index.get(name)
        if k is None:
            continue
        if time.perf_counter() - t0 > budget_s:
            break
        iso = onnx.ModelProto()
        iso.CopyFrom(proto)
        for j, inputs in rewire.items():
            if j != k:
                del iso.graph.node[j].input[:]
                iso.graph.node[j].input.extend(inputs)
                iso.graph.initializer.extend(floats[t] for t in inputs if t in floats)
        cand = work / "mixed-isolated.onnx"
        onnx.save(iso, str(cand))
        out[name] = output_snr_db(ref, run_model(cand, search))
        cand.unlink()
    return out
