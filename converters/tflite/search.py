"""android's mixed-precision hooks (:mod:`edgekit.mixed.search`): the fx nodes an int8 build may keep float,
ranked by local INT8 SQNR in the fake-quant program; the build with every activation int16 (the 16x8 build); and the 16x8 layer search, whose ops are ranked by the noise each adds and by what its
int8 weights cost the output. The converter's methods delegate here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from edgekit.converters import Artifact, ConvertJob, load_firmware
from edgekit.converters.common.fxrecord import reads_input, record_quantized
from edgekit.converters.common.pt2e import (
    SEARCH_CALIB,
    calibrated,
    exported_module,
    observer_outputs,
    torch_module,
    torch_run,
    torch_sample,
)
from edgekit.converters.tflite.a16 import a16_source, a16_write
from edgekit.converters.tflite.options import EXTRA, fused_hard, lstm_float, wide_activations
from edgekit.converters.tflite.quantizer import pt2e_quantizer

from edgekit.deps import require
from edgekit.mixed.search import A16_SEARCH_RUN_S, Layer, Search, output_snr_db, search_feeds
from edgekit.mixed.search import db as mixed_db
from edgekit.tflite_graph import TFLiteGraph, text

Convert = Callable[[ConvertJob], Artifact]


def mixed_unavailable(job: ConvertJob) -> str | None:
    if wide_activations(job):
        return ("--option activations=int16 was asked: every activation is already 16-bit, and the layer search "
                "keeps layers of the int8 build; leave the option out to search them, or pass --tolerance to "
                "accept this agreement")
    if job.model.is_tf:
        return ("Keras / SavedModel input is quantized whole by TensorFlow's TFLiteConverter, which keeps no "
                "chosen layer float; the PT2E path does: pass --option keras=onnx (tf2onnx, then PT2E), or "
                "--tolerance to accept this agreement")
    return None


def mixed_search(job: ConvertJob, artifact: Artifact) -> Search:
    """The fx nodes an int8 build may keep float (LiteRT runs them in float between DEQUANTIZE and
    QUANTIZE), ranked by local INT8 SQNR; the search runs the fake-quant program in torch."""
    m = job.model
    sample = torch_sample(m)
    module = exported_module(job, torch_module(job), sample, unroll_lstm=not lstm_float(job))
    method = artifact.meta["quantization"]["calibration_method"]
    base = tuple(job.options.get("keep_float_nodes") or ())
    search = search_feeds(job)
    # every kept set's observers take the statistics of the build's own calibration (this job's store,
    # :func:`calibrated`): the search scores the fake-quant program of the build it would make, calibrated once
    conv, _, _ = calibrated(job, module, sample, method, lambda obs: pt2e_quantizer(False, obs, base, fused_hard(job)),
                            limit=SEARCH_CALIB)
    layers = _local_sqnr(conv, search[:8], m)
    ref = torch_run(module, search, m)

    def build(kept: list[str], observer: str):
        return calibrated(job, module, sample, observer, lambda obs: pt2e_quantizer(False, obs, base + tuple(kept), fused_hard(job)),
                          limit=SEARCH_CALIB)[0]

    # an observer whose build litert-torch could not lower (the first build's record) is not measured again: a kept
    # set calibrated with it would fail to lower, and the fallback would read that as the set not converting
    skip = tuple(artifact.meta["quantization"].get("calibration_not_lowered") or ())
    outputs, calibration_for = observer_outputs(build, job, method, ref, search, skip=skip)
    return Search(layers, outputs, ref, "float (between DEQUANTIZE and QUANTIZE; LiteRT runs it in fp32)",
                  calibration_for)


def activations16(convert: Convert, job: ConvertJob, artifact: Artifact) -> Artifact | None:
    """Mixed precision's last step where an int8 build (and its layer search) fails verification: the build
    again with every activation int16 (``--option activations=int16``); None where the user chose
    ``--option activations``."""
    if "activations" in job.options:
        return None
    saved = job.options
    job.options = {k: v for k, v in saved.items() if k not in ("keep_float_nodes", "calibration", "lstm",
                                                                 "bias_correction")}
    job.options["activations"] = "int16"
    try:
        return convert(job)
    finally:
        job.options = saved


def _a16_options(job: ConvertJob, kept: list[str]) -> dict[str, Any]:
    """The options of a 16x8 build of ``job``: the int8 build's options without those of int8 activations."""
    opts = {k: v for k, v in job.options.items() if k not in ("keep_float_nodes", "calibration", "lstm",
                                                               "bias_correction")}
    return {**opts, "activations": "int16", "keep_float_tensors": list(kept)}


def a16_keep(convert: Convert, job: ConvertJob, artifact: Artifact, kept: list[str],
             calibration: str | None = None) -> Artifact:
    """The 16x8 build again with the ops writing ``kept`` float (the 16x8 layer search's ``keep_layers``)."""
    saved = job.options
    job.options = _a16_options(job, kept)
    try:
        return convert(job)
    finally:
        job.options = saved


def a16_search(job: ConvertJob, artifact: Artifact) -> Search:
    """The 16x8 layer search: every op with an int16 output may be kept float (ai-edge-quantizer's
    ``no_quantize``). Ranked by the worse of the relative noise each op adds (its output's error against the
    fp32 .tflite, every tensor kept, builtin kernels, less its inputs' error, on 8 search samples) and, for an
    op with int8 weights, the output SNR with only its weights rounded (:func:`_a16_weight_effect`). The search
    builds only quantize again (calibration ranges reused) and run in LiteRT; the reference is the fp32
    .tflite."""
    layout = artifact.meta.get("layout", "nchw")
    a = a16_source(job, layout)
    # LiteRT's reference int16 kernels are slow on large models: fewer samples there
    lat = artifact.meta.get("host_latency_ms") or {}
    ms = lat.get(str(job.options.get("threads") or 2)) or lat.get("1") or 0.0
    feeds = search_feeds(job, int(min(32, max(8, A16_SEARCH_RUN_S * 1000 / max(ms, 1e-3)))))
    names = [s.name for s in job.model.inputs]
    nhwc = layout == "nhwc"
    fw = load_firmware("tflite")

    def run(path: Path, on: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        from edgekit.verify import run_all

        model = fw.LiteRTModel(str(path), int(job.options.get("threads") or 2), nhwc, "ai_edge_litert")
        return run_all(lambda f: model([f[n] for n in names]), on)

    ref = run(a.src, feeds)
    built = job.work_dir / "search-16x8.tflite"
    base_kept = list(job.options.get("keep_float_tensors") or [])
    layers = _a16_local_noise(a.src, job.out_dir / artifact.primary, feeds[:8], names, nhwc, fw, base_kept)
    # an op's own noise says nothing of what the layers after it make of it: where its int8 weights alone cost
    # the output more, that ranks it (a 16x8 build's error is mostly its int8 weights')
    effect = _a16_weight_effect(a.src, job.out_dir / artifact.primary, lambda p: run(p, feeds), ref,
                                job.work_dir / "search-16x8-weights.tflite")
    for lay in layers:
        if lay.name in effect:
            lay.local_sqnr_db = min(lay.local_sqnr_db, effect[lay.name])

    def outputs(kept: list[str]) -> list[np.ndarray]:
        a16_write(job, a, built, base_kept + kept)
        return run(built, feeds)

    return Search(layers, outputs, ref, "float in the 16x8 model (between DEQUANTIZE and QUANTIZE; LiteRT runs "
                  "it in fp32)")


def _local_sqnr(converted, feeds: list[dict[str, np.ndarray]], m) -> list[Layer]:
    """Each quantized compute node of the fake-quant program with the SQNR of its own output's INT8
    quantize/dequantize (the activation before and after, on the same run) and, for a conv / linear, of its int8
    weights at its output (the lower of the two)."""
    g = converted.graph
    compute = ("conv", "linear", "add", "mul", "cat", "matmul", "bmm", "mean", "pool", "hardtanh", "relu")
    seen, weights = record_quantized(converted, feeds, m, skip_dequantize=False)
    layers = []
    for n in g.nodes:
        if n.op != "call_function" or not any(c in str(n.target) for c in compute) or (
                n.name not in seen and n.name not in weights):  # a conv fused with its ReLU: weights only
            continue
        db = float("inf")
        if n.name in seen:
            x = np.concatenate([a.ravel() for a, _ in seen[n.name]]).astype(np.float64)
            d = np.concatenate([b.ravel() for _, b in seen[n.name]]).astype(np.float64)
            db = mixed_db(float(np.sum(x ** 2)), float(np.sum((x - d) ** 2)))
        if n.name in weights:
            db = min(db, mixed_db(*weights[n.name]))
        stack = n.meta.get("nn_module_stack") or {}
        where = next(reversed(stack.values()))[0] if stack else ""
        op = str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target)
        layers.append(Layer(n.name, f"{op}{' ' + where if where else ''}", round(db, 2),
                            reads_input=reads_input(n)))
    return layers



# ops that compute (their rounding adds noise): the 16x8 layer search's candidates; data movement is left
_A16_MOVES = {"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "QUANTIZE", "DEQUANTIZE", "PAD", "PADV2", "SLICE",
              "STRIDED_SLICE", "SPLIT", "SPLIT_V", "GATHER", "CONCATENATION", "PACK", "UNPACK", "MAX_POOL_2D",
              "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "RESIZE_NEAREST_NEIGHBOR"}


def _a16_local_noise(src: Path, built: Path, feeds: list[dict[str, np.ndarray]], names: list[str], nhwc: bool,
                     fw: Any, kept: list[str]) -> list[Layer]:
    """The 16x8 build's ops with an int16 output, each with the noise it adds itself: every tensor of the fp32
    and the 16x8 model kept (builtin kernels, no XNNPACK, so none is fused away), then per op the relative error
    power of its output against the fp32 one, less the largest of its activation inputs'. ``local_sqnr_db`` is
    that added noise in dB below the signal (low: the op's own rounding costs most)."""
    litert = require("ai_edge_litert.interpreter", EXTRA)

    def interp(path: Path):
        it = litert.Interpreter(model_path=str(path), experimental_preserve_all_tensors=True,
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        it.allocate_tensors()
        return it

    f_it, q_it = interp(src), interp(built)
    f_idx = {d["name"]: d["index"] for d in f_it.get_tensor_details()}
    q_det = {d["name"]: d for d in q_it.get_tensor_details()}
    g = TFLiteGraph(built)
    cands: list[tuple[str, str, list[str]]] = []  # (op, output tensor, activation inputs)
    for op, ins, outs in g.operators():
        if not outs or op in _A16_MOVES or g.type_name(outs[0]) != "INT16":
            continue
        out = g.tensor_name(outs[0])
        if out in f_idx and out not in kept:
            cands.append((op, out, [g.tensor_name(i) for i in ins if i >= 0 and not g.is_const(i)]))
    watched = {t for _, out, ins in cands for t in [out, *ins] if t in f_idx and t in q_det}
    sig = dict.fromkeys(watched, 0.0)
    noise = dict.fromkeys(watched, 0.0)
    for feed in feeds:
        for it in (f_it, q_it):  # as the bundle's runner feeds it: quantized with the input's scale, NHWC
            for n, d in zip(names, it.get_input_details(), strict=True):
                x = np.asarray(feed[n], dtype=np.float32)
                it.set_tensor(d["index"], fw.quantize(x.transpose(0, 2, 3, 1) if nhwc and x.ndim == 4 else x, d))
            it.invoke()
        for t in watched:
            ref = f_it.get_tensor(f_idx[t]).astype(np.float64)
            d = q_det[t]
            got = q_it.get_tensor(d["index"])
            sc, zp = d["quantization_parameters"]["scales"], d["quantization_parameters"]["zero_points"]
            got = (got.astype(np.float64) - (zp[0] if len(zp) else 0)) * sc[0] if len(sc) == 1 else got
            if np.shape(got) != np.shape(ref):
                continue
            sig[t] += float(np.sum(ref ** 2))
            noise[t] += float(np.sum((np.asarray(got, np.float64) - ref) ** 2))

    def rel(t: str) -> float:
        return noise.get(t, 0.0) / sig[t] if sig.get(t) else 0.0

    layers = []
    for op, out, ins in cands:
        added = rel(out) - max((rel(t) for t in ins), default=0.0)
        layers.append(Layer(out, op, float(-10 * np.log10(max(added, 1e-12)))))
    return layers


def _a16_weight_effect(src: Path, built: Path, run: Callable[[Path], list[np.ndarray]], ref: list[np.ndarray],
                       scratch: Path) -> dict[str, float]:
    """Per op with int8 weights in the 16x8 build (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED ...): the model's
    output SNR (dB) against ``ref`` when only that op's weights are rounded as the build rounds them (its int8
    values times its scales, written into the fp32 .tflite's float weights; ``run`` runs a .tflite on the search
    samples). What the local noise cannot see: how much the layers after an op amplify its error (an early
    convolution may add little noise locally and cost the output most).
    Keyed by the op's output tensor name; ops whose float weights are not a plain float32 constant are left out."""
    schema = require("ai_edge_litert.schema_py_generated", EXTRA)
    raw = bytearray(src.read_bytes())
    fm = schema.Model.GetRootAs(raw, 0)
    fsg = fm.Subgraphs(0)
    base = np.frombuffer(raw, np.uint8).__array_interface__["data"][0]
    weights: dict[str, tuple[int, int]] = {}  # output tensor -> (offset, bytes) of its float weights in ``raw``
    for i in range(fsg.OperatorsLength()):
        op = fsg.Operators(i)
        if op.OutputsLength() < 1 or op.InputsLength() < 2 or op.Inputs(1) < 0:
            continue
        t = fsg.Tensors(op.Inputs(1))
        data = fm.Buffers(t.Buffer()).DataAsNumpy() if t.Buffer() > 0 else 0
        if t.Type() != schema.TensorType.FLOAT32 or not isinstance(data, np.ndarray) or not data.size:
            continue
        weights[text(fsg.Tensors(op.Outputs(0)).Name())] = (data.__array_interface__["data"][0] - base, data.nbytes)
    g = TFLiteGraph(built)
    out: dict[str, float] = {}
    for _, ins, outs in g.operators():
        if len(ins) < 2 or not outs or g.type_name(ins[1]) != "INT8" or not g.is_const(ins[1]):
            continue
        name = g.tensor_name(outs[0])
        t = g.sg.tensors[ins[1]]
        q = t.quantization
        data = g.model.buffers[t.buffer].data
        if name not in weights or q is None or q.scale is None or data is None:
            continue
        off, n = weights[name]
        w = np.frombuffer(bytes(data), np.int8).astype(np.float32)
        scale = np.asarray(q.scale, np.float32)
        if w.size * 4 != n or scale.size not in (1, int(t.shape[q.quantizedDimension])):
            continue
        shape = [1] * len(t.shape)
        shape[q.quantizedDimension] = -1
        rounded = (w.reshape(t.shape) * (scale.reshape(shape) if scale.size > 1 else scale[0])).astype(np.float32)
        orig = bytes(raw[off:off + n])
        raw[off:off + n] = rounded.tobytes()
        scratch.write_bytes(raw)
        raw[off:off + n] = orig
        out[name] = output_snr_db(ref, run(scratch))
    return out
