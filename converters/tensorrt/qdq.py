"""Q/DQ placement and writing: the preprocessed float model, the Q/DQ model quantize_static writes from a ranges
cache, and a host run of either (the measure every INT8 step compares by)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

from edgekit.converters import ConvertJob, load_firmware
from edgekit.converters.tensorrt.calibration import CALIBRATIONS, TRT_QDQ_OPS, placement
from edgekit.deps import require

# ``--option qdq=``: where the Q/DQ pairs go.
# "tensorrt" (default): TensorRT's own placement guidance, as NVIDIA ModelOpt's ONNX PTQ does it: Q/DQ on the
#   *inputs* of the layers TensorRT runs in INT8 (convolutions, GEMM/MatMul, average pooling), none on their
#   outputs, float biases; everything else (normalization written as ops, Sigmoid/Softmax, Add/Mul, LSTM state
#   arithmetic) is left to TensorRT's fp16 under --int8 --fp16. A Q/DQ on an output or on a pointwise op only
#   adds rounding TensorRT would otherwise not do (a LayerNorm written as ReduceMean/Sub/Pow/Sqrt/Div suffers most).
# "all": onnxruntime's default (every op it has a QDQ rule for, inputs and outputs).
# TRT_QDQ_OPS and placement() live in calibration.py, which calibrates only those ops' tensors under "tensorrt"
# ops whose nodes quantize_static gives Q/DQ under "all" and that mixed precision may keep float
QUANTIZED_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "Concat", "AveragePool",
                 "GlobalAveragePool", "MaxPool", "Resize", "Sigmoid", "Softmax", "LeakyRelu", "HardSwish",
                 "Where", "Split", "Pad", "ReduceMean", "InstanceNormalization", "LayerNormalization", "Gather"}


def preprocessed(job: ConvertJob, src: Path) -> Path:
    """onnxruntime's quantization pre-processing (shape inference, BASIC optimization), every node named
    (nodes_to_exclude and the mixed-precision search address nodes by name)."""
    onnx = require("onnx", "jetson")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = job.work_dir / "preprocessed.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    proto = onnx.load(str(pre))
    seen: set[str] = set()
    for i, n in enumerate(proto.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.op_type}_{i}"
        seen.add(n.name)
    unshare_biases(proto)
    onnx.save(proto, str(pre))
    return pre


BIASED_OPS = ("Conv", "ConvTranspose", "Gemm")


def unshare_biases(proto) -> int:
    """Give each Conv / ConvTranspose / Gemm a bias initializer of its own (tf2onnx shares one between layers
    with equal biases). quantize_static copies a shared bias itself, naming the copy the bias's name plus a
    number without checking the names of activations: ``conv_25`` shared 18 times became ``conv_252``, the
    name of another layer's output, and onnxruntime then ran that Conv with a [1, 36, 1, 172] bias. Copies
    made here get names no tensor has. Returns the number of copies."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    users: dict[str, list] = {}
    for n in graph.node:
        if n.op_type in BIASED_OPS and len(n.input) > 2 and n.input[2] in inits:
            users.setdefault(n.input[2], []).append(n)
    taken = set(inits) | {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    taken |= {t for n in graph.node for t in (*n.input, *n.output)}
    copies = 0
    for name, nodes in users.items():
        for n in nodes[1:]:
            k = 0
            while f"{name}_own{k}" in taken:
                k += 1
            copy = graph.initializer.add()
            copy.CopyFrom(inits[name])
            copy.name = n.input[2] = f"{name}_own{k}"
            taken.add(copy.name)
            copies += 1
    return copies


def write_qdq(pre: Path, dest: Path, ranges: Path, name: str, excluded: list[str], placement: str) -> None:
    """The Q/DQ model of ``pre`` at the activation ranges of the cache ``ranges`` (calibration method ``name``'s),
    the nodes named in ``excluded`` left float, the pairs placed as ``placement`` says."""
    q = require("onnxruntime.quantization", "jetson")

    extra: dict = {"ActivationSymmetric": True, "WeightSymmetric": True}
    kw: dict = {}
    if placement == "tensorrt":
        kw["op_types_to_quantize"] = list(TRT_QDQ_OPS)
        extra.update(OpTypesToExcludeOutputQuantization=list(TRT_QDQ_OPS), QuantizeBias=False, DedicatedQDQPair=True)
    with contextlib.redirect_stdout(io.StringIO()):
        q.quantize_static(
            str(pre), str(dest), None,
            quant_format=q.QuantFormat.QDQ,
            activation_type=q.QuantType.QInt8,  # TensorRT takes symmetric signed INT8 only
            weight_type=q.QuantType.QInt8,
            per_channel=True,
            calibrate_method=getattr(q.CalibrationMethod, CALIBRATIONS[name][0]),
            calibration_cache_path=str(ranges),
            nodes_to_exclude=excluded,
            extra_options=extra,
            **kw,
        )


def run_model(path: Path, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """``path``'s outputs on ``feeds`` with the bundle's own onnxruntime runner (firmware/tensorrt/run.py)."""
    from edgekit.verify import run_all

    return run_all(load_firmware("tensorrt").OnnxRuntimeModel(str(path)), feeds)
