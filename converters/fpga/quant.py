"""Calibrate, export and execute the fabric's quantized model (the graph is quantized in ``graph``).

Post-training quantization calibrates the activation scales on the calibration set; the model is exported as
QONNX, cleaned by qonnx (channels-last, Gemm -> MatMul) and executed by qonnx as the integer-exact reference.

Every scale is a power of two (brevitas ``FixedPoint`` quantizers) and biases are
quantized with scale = input scale x weight scale (``Int32Bias``): the only setting in
which hls4ml's ap_fixed arithmetic is bit-exact against QONNX execution. Inputs must lie
on the input quantizer's grid: ``quantize_input`` snaps them (the board driver does the
same before the DMA).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import ConversionError
from edgekit.onnx_graph import cap_ir_version

# activations that hls4ml computes from lookup tables (1024 entries): only after the last layer
TABLE_ACTS = {"Sigmoid": "sigmoid", "Softmax": "softmax"}
BITS = {"int8": 8, "int4": 4}


def _table_activation_class():
    torch = require("torch")

    class TableActivation(torch.nn.Module):
        """Sigmoid / softmax on the (dequantized) logits: float in QONNX, a lookup table in hls4ml."""

        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def forward(self, x):
            x = getattr(x, "value", x)  # a brevitas QuantTensor after a QuantReLU
            return torch.sigmoid(x) if self.kind == "sigmoid" else torch.softmax(x, dim=-1)

    return TableActivation


def TableActivation(kind: str):
    return _table_activation_class()(kind)


def calibrate(qmodel, calib: np.ndarray) -> None:
    torch = require("torch")
    from brevitas.graph.calibrate import calibration_mode

    with torch.no_grad(), calibration_mode(qmodel):
        for i in range(0, len(calib), 32):
            qmodel(torch.from_numpy(np.ascontiguousarray(calib[i : i + 32], dtype=np.float32)))


def export_qonnx(qmodel, example: np.ndarray, raw: Path, clean: Path, channels_last_input: bool) -> Any:
    """brevitas -> QONNX -> qonnx cleanup, channels-last, Gemm->MatMul. Returns the ModelWrapper.

    ``channels_last_input``: CNNs take NHWC input on the fabric (hls4ml is channels-last)."""
    torch = require("torch")
    from brevitas.export import export_qonnx as _export
    from qonnx.core.modelwrapper import ModelWrapper
    from qonnx.transformation.channels_last import ConvertToChannelsLastAndClean
    from qonnx.transformation.gemm_to_matmul import GemmToMatMul
    from qonnx.util.cleanup import cleanup_model

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            _export(qmodel, torch.from_numpy(np.ascontiguousarray(example[:1], dtype=np.float32)),
                    export_path=str(raw), dynamo=False)
        except Exception as exc:  # brevitas export failure on a chain we accepted is a bug worth seeing
            raise ConversionError(f"brevitas QONNX export failed: {type(exc).__name__}: {exc}") from exc
        mw = cleanup_model(ModelWrapper(str(raw)))
        mw = mw.transform(ConvertToChannelsLastAndClean(make_input_channels_last=channels_last_input))
        mw = tidy_transposes(mw, channels_last_input)
        mw = mw.transform(GemmToMatMul())
        mw = cleanup_model(mw)
    cap_ir_version(mw.model)  # onnxruntime (used by qonnx execution) rejects IR 14 (onnx 1.23)
    mw.save(str(clean))
    return mw


def tidy_transposes(mw, channels_last_input: bool):
    """Layout transposes qonnx's channels-last conversion leaves at forks and concats (hls4ml streams no
    Transpose): identical transposes of one tensor merged, and a Concat of channels-first transposes turned into a
    channels-last Concat followed by one transpose, until qonnx's own passes cancel the pairs."""
    from onnx import helper
    from qonnx.transformation.channels_last import ConvertToChannelsLastAndClean
    from qonnx.transformation.general import SortGraph
    from qonnx.transformation.infer_shapes import InferShapes

    def perm(n):
        return tuple(next((list(a.ints) for a in n.attribute if a.name == "perm"), []))

    outputs = {o.name for o in mw.graph.output}
    for _ in range(20):
        changed = False
        g = mw.graph
        seen: dict[tuple, Any] = {}
        for n in list(g.node):
            if n.op_type != "Transpose" or n.output[0] in outputs:
                continue
            key = (n.input[0], perm(n))
            if key not in seen:
                seen[key] = n
                continue
            for m in g.node:
                for i, x in enumerate(m.input):
                    if x == n.output[0]:
                        m.input[i] = seen[key].output[0]
            g.node.remove(n)
            changed = True
        for n in list(g.node):
            if n.op_type != "Concat":
                continue
            prods = [mw.find_producer(i) for i in n.input]
            shape = mw.get_tensor_shape(n.output[0]) or []
            nd = len(shape)
            first = tuple([0, nd - 1] + list(range(1, nd - 1)))  # channels-last -> channels-first
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0) % max(nd, 1)
            if nd < 3 or axis != 1 or not all(p is not None and p.op_type == "Transpose" and perm(p) == first
                                                and len(mw.find_consumers(p.output[0]) or []) == 1 for p in prods):
                continue
            cl = n.output[0] + "_channels_last"
            idx = list(g.node).index(n)
            concat = helper.make_node("Concat", [p.input[0] for p in prods], [cl], name=n.name, axis=nd - 1)
            back = helper.make_node("Transpose", [cl], [n.output[0]], name=n.name + "_to_channels_first",
                                    perm=list(first))
            g.node.remove(n)
            g.node.insert(idx, back)
            g.node.insert(idx, concat)
            for p in prods:
                g.node.remove(p)
            changed = True
        if not changed:
            break
        mw = mw.transform(SortGraph())
        mw = mw.transform(InferShapes())
        mw = mw.transform(ConvertToChannelsLastAndClean(make_input_channels_last=channels_last_input))
    return mw


def input_quant(mw) -> dict[str, Any]:
    """The first Quant node (on the graph input): scale, zero point, bits, signed, narrow, rounding."""
    from onnx import helper

    g = mw.graph
    node = next((n for n in g.node if n.op_type == "Quant" and n.input[0] == g.input[0].name), None)
    if node is None:
        raise ConversionError("QONNX model has no Quant node on its input; cannot snap inputs to its grid")
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    vals = [mw.get_initializer(i) for i in node.input[1:4]]
    rm = a.get("rounding_mode", b"ROUND")
    return {"scale": float(np.asarray(vals[0]).reshape(-1)[0]), "zeropt": float(np.asarray(vals[1]).reshape(-1)[0]),
            "bits": int(np.asarray(vals[2]).reshape(-1)[0]), "signed": bool(a.get("signed", 1)),
            "narrow": bool(a.get("narrow", 0)), "rounding_mode": rm.decode() if isinstance(rm, bytes) else rm}


def quantize_input(x: np.ndarray, q: dict[str, Any]) -> np.ndarray:
    """Snap ``x`` to the input quantizer's grid (QONNX Quant semantics: round, clip, rescale)."""
    from qonnx.custom_op.general.quant import quant

    return quant(np.asarray(x, np.float32), np.float32(q["scale"]), np.float32(q["zeropt"]), np.float32(q["bits"]),
                 int(q["signed"]), int(q["narrow"]), q["rounding_mode"]).astype(np.float32)


def is_pow2(v: float) -> bool:
    return v > 0 and float(np.log2(v)).is_integer()


def quant_summary(mw) -> list[dict[str, Any]]:
    """Every Quant node: bits, scale(s), whether each scale is a power of two."""
    out = []
    for n in mw.graph.node:
        if n.op_type != "Quant":
            continue
        scale = np.asarray(mw.get_initializer(n.input[1]), dtype=np.float64).reshape(-1)
        bits = np.asarray(mw.get_initializer(n.input[3])).reshape(-1)
        out.append({"node": n.name, "bits": int(bits[0]),
                    "scale": [float(s) for s in scale[:4]], "pow2": bool(all(is_pow2(float(s)) for s in scale))})
    return out


def qonnx_execute(mw, x: np.ndarray, full: bool = False) -> Any:
    """Integer-exact reference: QONNX execution, one sample at a time (the graph has batch 1)."""
    from qonnx.core.onnx_exec import execute_onnx

    iname, oname = mw.graph.input[0].name, mw.graph.output[0].name
    if full:
        return execute_onnx(mw, {iname: x[:1]}, return_full_exec_context=True)
    return np.concatenate([execute_onnx(mw, {iname: x[i : i + 1]})[oname] for i in range(len(x))])
