"""Quantize a small float model for the FPGA fabric and export it as QONNX.

The float model is exported to ONNX and cleaned (onnxslim folds BatchNorm into Conv);
its node chain is read into a list of layers that the fabric path supports:
Conv (2-D, group 1), Gemm / MatMul(+Add), Relu, MaxPool, Flatten / Reshape. The chain
is rebuilt with brevitas quantized layers, the weights copied in, and post-training
quantization calibrates the activation scales on the calibration set.

Every scale is a power of two (brevitas ``FixedPoint`` quantizers) and biases are
quantized with scale = input scale x weight scale (``Int16Bias``): the only setting in
which hls4ml's ap_fixed arithmetic is bit-exact against QONNX execution. Inputs must lie
on the input quantizer's grid: ``quantize_input`` snaps them (the board driver does the
same before the DMA).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import ConversionError, UnsupportedOpError
from edgekit.onnx_graph import cap_ir_version

FPGA_OPS = ("Conv", "Gemm", "MatMul", "Add", "Relu", "MaxPool", "Flatten", "Reshape", "Sigmoid", "Softmax")
# activations that hls4ml computes from lookup tables (1024 entries): they end the chain, after the logits
TABLE_ACTS = {"Sigmoid": "sigmoid", "Softmax": "softmax"}
BITS = {"int8": 8, "int4": 4}


@dataclass
class Layer:
    kind: str  # conv | linear | relu | maxpool | flatten
    name: str
    weight: np.ndarray | None = None  # torch layout: conv [out, in, kh, kw], linear [out, in]
    bias: np.ndarray | None = None
    attrs: dict[str, Any] = field(default_factory=dict)


def read_chain(onnx_path: Path) -> list[Layer]:
    """The float ONNX graph as a chain of fabric layers; any other op is refused by name."""
    onnx = require("onnx", "fpga")
    from onnx import numpy_helper

    proto = onnx.load(str(onnx_path))
    g = proto.graph
    if len(g.input) != 1 or len(g.output) != 1:
        raise UnsupportedOpError("the FPGA target takes models with one input and one output")
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node if n.op_type == "Constant"}
    inits.update(consts)
    nodes = [n for n in g.node if n.op_type != "Constant"]
    bad = [f"{n.op_type} (node {n.name})" for n in nodes if n.op_type not in FPGA_OPS]
    if bad:
        raise UnsupportedOpError(
            f"the FPGA fabric path takes chains of {', '.join(FPGA_OPS)}; this model also has "
            f"{', '.join(bad[:6])}: retrain a smaller model (see examples/digits_fpga/train.py)"
        )
    layers: list[Layer] = []
    cur = g.input[0].name
    for n in nodes:
        data_in = [i for i in n.input if i and i not in inits]
        if data_in != [cur]:
            raise UnsupportedOpError(
                f"node {n.name} ({n.op_type}) is not in a single chain (inputs {list(n.input)}): "
                "the FPGA fabric path takes sequential models without branches or residual adds"
            )
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        if n.op_type == "Conv":
            w = inits[n.input[1]]
            b = inits[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(w.shape[0], np.float32)
            pads = list(a.get("pads", [0, 0, 0, 0]))
            if a.get("group", 1) != 1 or any(d != 1 for d in a.get("dilations", [1, 1])) or w.ndim != 4:
                raise UnsupportedOpError(f"Conv {n.name}: only 2-D, group 1, dilation 1 convolutions run on the fabric")
            if pads[:2] != pads[2:] or pads[0] != pads[1]:
                raise UnsupportedOpError(f"Conv {n.name}: asymmetric padding {pads} is not supported")
            layers.append(Layer("conv", n.name, w, b, {"stride": list(a.get("strides", [1, 1])), "pad": pads[0]}))
        elif n.op_type in ("Gemm", "MatMul"):
            w = inits[n.input[1]]
            if n.op_type == "MatMul" or not a.get("transB", 0):
                w = w.T
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise UnsupportedOpError(f"Gemm {n.name}: transA/alpha/beta other than defaults")
            b = inits[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(w.shape[0], np.float32)
            layers.append(Layer("linear", n.name, np.ascontiguousarray(w), b))
        elif n.op_type == "Add":
            if not layers or layers[-1].kind != "linear" or len(data_in) != 1:
                raise UnsupportedOpError(f"Add {n.name}: only a bias add after MatMul runs on the fabric")
            const = next(inits[i] for i in n.input if i in inits)
            layers[-1].bias = layers[-1].bias + const.reshape(-1)
        elif n.op_type == "Relu":
            layers.append(Layer("relu", n.name))
        elif n.op_type in TABLE_ACTS:
            if n.op_type == "Softmax" and a.get("axis", -1) not in (-1, 1):
                raise UnsupportedOpError(f"Softmax {n.name}: axis {a['axis']}; hls4ml's io_parallel softmax runs over "
                                         "the features of a [batch, features] tensor (axis -1)")
            layers.append(Layer(TABLE_ACTS[n.op_type], n.name))
        elif n.op_type == "MaxPool":
            if any(p for p in a.get("pads", [0])) or a.get("ceil_mode", 0):
                raise UnsupportedOpError(f"MaxPool {n.name}: padding / ceil_mode is not supported")
            k = list(a["kernel_shape"])
            layers.append(Layer("maxpool", n.name, attrs={"kernel": k, "stride": list(a.get("strides", k))}))
        else:  # Flatten / Reshape to [batch, features]
            layers.append(Layer("flatten", n.name))
        cur = n.output[0]
    if not any(lay.kind in ("conv", "linear") for lay in layers):
        raise UnsupportedOpError("the model has no Conv or Linear layer: nothing to put on the fabric")
    last = max(i for i, lay in enumerate(layers) if lay.kind in ("conv", "linear"))
    early = [lay for lay in layers[:last] if lay.kind in TABLE_ACTS.values()]
    tail = [lay.kind for lay in layers[last + 1:]]
    if early or tail not in ([], ["relu"], ["sigmoid"], ["softmax"], ["relu", "sigmoid"], ["relu", "softmax"]):
        where = early[0] if early else layers[last + 1]
        raise UnsupportedOpError(
            f"{where.kind} (node {where.name}): the fabric path takes Sigmoid / Softmax only as the last layer, after "
            "the logits (and a ReLU on them); a limitation of edgekit's converter, not of hls4ml")
    return layers


def build_brevitas(layers: list[Layer], bits: int, signed_input: bool, po2: bool = True):
    """A brevitas nn.Sequential equal to the float chain, with ``bits``-bit weights and activations.

    ``po2=False`` gives float scales (only for showing that they are not bit-exact)."""
    torch = require("torch")
    qnn = require("brevitas.nn", "fpga")
    from brevitas.quant import (
        Int8ActPerTensorFixedPoint,
        Int8ActPerTensorFloat,
        Int8WeightPerTensorFixedPoint,
        Int8WeightPerTensorFloat,
        Uint8ActPerTensorFixedPoint,
        Uint8ActPerTensorFloat,
    )
    from brevitas.quant.scaled_int import Int16Bias

    wq = Int8WeightPerTensorFixedPoint if po2 else Int8WeightPerTensorFloat
    sact = Int8ActPerTensorFixedPoint if po2 else Int8ActPerTensorFloat
    uact = Uint8ActPerTensorFixedPoint if po2 else Uint8ActPerTensorFloat
    # the input keeps 8 bits (the sensor / DMA word); weights and hidden activations take `bits`
    mods: list[Any] = [qnn.QuantIdentity(act_quant=sact if signed_input else uact, bit_width=8,
                                         return_quant_tensor=True)]
    lin_idx = [i for i, lay in enumerate(layers) if lay.kind in ("conv", "linear")]
    tail = [lay.kind for lay in layers[lin_idx[-1] + 1:]]
    for i, lay in enumerate(layers):
        last = i == lin_idx[-1] and "relu" not in tail  # a ReLU after the logits re-quantizes them
        common = {"weight_quant": wq, "weight_bit_width": bits, "bias_quant": Int16Bias,
                  "return_quant_tensor": not last}
        if lay.kind == "conv":
            w = lay.weight
            m = qnn.QuantConv2d(w.shape[1], w.shape[0], w.shape[2:], stride=lay.attrs["stride"],
                                padding=lay.attrs["pad"], bias=True, **common)
        elif lay.kind == "linear":
            m = qnn.QuantLinear(lay.weight.shape[1], lay.weight.shape[0], bias=True, **common)
        elif lay.kind == "relu":
            m = qnn.QuantReLU(act_quant=uact, bit_width=bits, return_quant_tensor=i < len(layers) - 1)
        elif lay.kind in ("sigmoid", "softmax"):
            m = TableActivation(lay.kind)
        elif lay.kind == "maxpool":
            m = torch.nn.MaxPool2d(lay.attrs["kernel"], stride=lay.attrs["stride"])  # QuantTensor passes through
        else:
            m = torch.nn.Flatten()
        if lay.weight is not None:
            with torch.no_grad():
                m.weight.copy_(torch.tensor(lay.weight))
                m.bias.copy_(torch.tensor(lay.bias))
        mods.append(m)
        nxt = layers[i + 1].kind if i + 1 < len(layers) else None
        if lay.kind in ("conv", "linear") and i != lin_idx[-1] and nxt != "relu":
            # a linear layer feeding another without ReLU: re-quantize the signed activation
            mods.append(qnn.QuantIdentity(act_quant=sact, bit_width=bits, return_quant_tensor=True))
    return torch.nn.Sequential(*mods).eval()


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


def TableActivation(kind: str):  # noqa: N802 - a module factory (torch is imported lazily)
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
