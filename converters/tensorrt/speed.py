"""The INT8 engine's speed on the board, estimated. onnxruntime on this host's CPU says nothing about TensorRT on a
Jetson, so the jetson target does not time its Q/DQ model here: the cost model (:mod:`edgekit.costmodel`) prices
each layer at the precision TensorRT runs it and compares the INT8 engine with the fp16 engine of the same model.

- A Conv / ConvTranspose / Gemm / MatMul whose data input comes through a DequantizeLinear runs an INT8 kernel
  (TensorRT fuses the Q/DQ pair into it).
- A layer left out of Q/DQ (``keep_float_nodes``, mixed precision) runs at the target's ``kept_precision``
  (fp16: the engine is built ``--int8 --fp16``), plus a reformat of its input and of its output: a kernel launch
  and a pass over the tensor each, where INT8 and fp16 layers meet.

The figures are an estimate, never a verdict: the engine is timed with ``trtexec`` on the board
(``bench/trt_speed.sh``)."""

from __future__ import annotations

from pathlib import Path

from edgekit.analyze import WEIGHT_OPS, analyze_onnx
from edgekit.converters import Artifact, ConvertJob
from edgekit.costmodel import Candidate, calibrated, estimate, layer_terms
from edgekit.deps import require
from edgekit.speed import Speed

QDQ_KERNELS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def int8_layers(qdq_path: Path) -> tuple[set[str], set[str]]:
    """(names of the compute nodes that run INT8 kernels, names of every compute node) in a Q/DQ model."""
    onnx = require("onnx", "jetson")
    graph = onnx.load(str(qdq_path), load_external_data=False).graph
    producer = {out: n.op_type for n in graph.node for out in n.output}
    compute = {n.name for n in graph.node if n.op_type in QDQ_KERNELS}
    quantized = {n.name for n in graph.node if n.op_type in QDQ_KERNELS and n.input
                 and producer.get(n.input[0]) == "DequantizeLinear"}
    return quantized, compute


def board_estimate(job: ConvertJob, artifact: Artifact) -> Speed | None:
    """The INT8 engine against the fp16 engine on ``job.board`` at its default power mode, from the cost model;
    None where the float graph is not at hand or its layers cannot be matched to the Q/DQ model's nodes."""
    float_onnx = next((p for p in (job.work_dir / "float.onnx", job.float_onnx) if p is not None and p.is_file()),
                      None)
    if float_onnx is None or artifact.precision != "int8":
        return None
    stats = analyze_onnx(float_onnx)
    quantized, compute = int8_layers(job.out_dir / artifact.primary)
    layers = [lay for lay in stats.layers if lay.op in WEIGHT_OPS and lay.macs > 0 and lay.name in compute]
    if not layers:
        return None
    kept = tuple(lay.name for lay in layers if lay.name not in quantized)
    board = calibrated(job.board)
    mode = board.default_power_mode
    kept_prec = job.target.kept_precision
    cand = Candidate("int8", mode, float_layers=kept, kept_precision=kept_prec)
    int8 = estimate(stats, board, cand)
    fp = estimate(stats, board, Candidate(kept_prec, mode))
    # a kept layer between INT8 layers: a reformat of its input and of its output (a launch and a pass each)
    launch_ms = board.launch_overhead_us / 1e3
    terms = {t.name: t for t in layer_terms(stats, board, cand)}
    reformat_ms = sum(2 * (launch_ms + terms[name].pass_ms) for name in kept) if len(kept) < len(layers) else 0.0
    n_int8 = len(layers) - len(kept)
    kernels = f"{n_int8} of {len(layers)} conv / matmul layers on INT8 kernels"
    if kept:
        kernels += f", {len(kept)} on {kept_prec} kernels with a reformat before and after each"
    return Speed(
        runtime=f"TensorRT on {board.name} at {mode}, cost model", float_ms=round(fp.latency_ms, 4),
        ms=round(int8.latency_ms + reformat_ms, 4), runs=0, kernels=kernels, judged=False,
        not_judged=("an estimate from the board profile, not a timing: onnxruntime on this host's CPU says nothing "
                    "about TensorRT; time both engines with trtexec on the board (bench/trt_speed.sh)"),
        float_precision=kept_prec, estimated=True)
