"""The C simulation checked against QONNX execution: inputs snapped onto the input quantizer's grid, the hls4ml
model's predictions, bit-exactness (a lookup-table activation at the end judged within its resolution) and the
first layer where a mismatch starts."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.converters.fpga import quant as fq
from edgekit.errors import VerificationError
from edgekit.quiet import quiet_python

CHECK_SAMPLES = 64  # calibration samples checked bit-exact inside convert()
# hls4ml's sigmoid / softmax are 1024-entry lookup tables: the sigmoid table steps its input by 1/64 (slope <= 1/4:
# error <= 1/256); softmax adds an exp and an inverse table of 18-bit entries.
TABLE_TOL = {"Sigmoid": 2 ** -7, "Softmax": 2 ** -5}
TRACED_SAMPLES = 4  # calibration samples whose every layer before the table is traced and compared bit for bit


def fabric_input(state: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """NCHW float input -> channels-last (CNN) and snapped onto the input quantizer's grid."""
    x = np.asarray(x, np.float32)
    if state["cnn"] and x.ndim in (3, 4):
        x = np.moveaxis(x, 1, -1)  # channels last
    return fq.quantize_input(np.ascontiguousarray(x), state["iq"])


def predict(state: dict[str, Any], x: np.ndarray) -> np.ndarray:
    with quiet_python(root_logger=False):
        out = state["hm"].predict(np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32))
    return np.asarray(out, np.float32).reshape(len(x), -1)


def require_exact(state: dict[str, Any], x: np.ndarray, ref: np.ndarray, got: np.ndarray, what: str) -> None:
    """Bit-exact C simulation against QONNX execution. With a lookup-table activation at the end (sigmoid,
    softmax), every layer up to the logits must be bit-exact (traced) and the table's output within its
    resolution of the exact function on those logits."""
    ref = ref.reshape(len(x), -1).astype(np.float32)
    got = got.reshape(len(x), -1)
    table = state.get("table")
    if table is not None:
        close = np.max(np.abs(ref - got), axis=1) <= table["tolerance"]
        be = state.setdefault("table_check", {"samples": 0, "within": 0, "max_abs_diff": 0.0, **table})
        be["samples"] += len(x)
        be["within"] += int(close.sum())
        be["max_abs_diff"] = max(be["max_abs_diff"], float(np.max(np.abs(ref - got))) if ref.size else 0.0)
        if not close.all():
            i = int(np.argmin(close))
            raise VerificationError(
                f"hls4ml's {table['op']} table (node {table['node']}) is off by "
                f"{float(np.max(np.abs(ref[i] - got[i]))):.4g} from the exact {table['op']} of the fabric's logits "
                f"(tolerance {table['tolerance']:g}) on {len(x) - int(close.sum())} of {len(x)} {what}")
        # the layers before the table, bit for bit, traced once per build (hls4ml's trace() recompiles the library)
        traced = 0 if state.get("traced") else min(len(x), TRACED_SAMPLES)
        state["traced"] = True
        for k in range(traced):
            layer = first_mismatch(state["hm"], state["mw"], x[k:k + 1], skip=table["node"])
            if layer is not None:
                raise VerificationError(f"hls4ml C simulation is not bit-exact against QONNX execution before the "
                                        f"{table['op']} table on {what}; the mismatch starts at {layer}")
        be = state.setdefault("bit_exact", {"samples": 0, "exact": 0, "max_abs_diff": 0.0,
                                            "checked": f"every layer before the {table['op']} table, traced"})
        be["samples"] += traced
        be["exact"] += traced
        return
    exact = np.all(ref == got, axis=1)
    be = state.setdefault("bit_exact", {"samples": 0, "exact": 0, "max_abs_diff": 0.0})
    be["samples"] += len(x)
    be["exact"] += int(exact.sum())
    be["max_abs_diff"] = max(be["max_abs_diff"], float(np.max(np.abs(ref - got))) if ref.size else 0.0)
    if not exact.all():
        i = int(np.argmin(exact))
        layer = first_mismatch(state["hm"], state["mw"], x[i : i + 1])
        raise VerificationError(
            f"hls4ml C simulation is not bit-exact against QONNX execution on {len(x) - int(exact.sum())} of "
            f"{len(x)} {what} (max |diff| {float(np.max(np.abs(ref - got))):.6g}); the mismatch starts at "
            f"{layer}. Use power-of-two scales and quantized biases (the default); float scales are never exact")


def first_mismatch(hm, mw, x1: np.ndarray, skip: str | None = None) -> str | None:
    """The first hls4ml layer whose C-simulation output matches no QONNX tensor it stands for.

    hls4ml fuses nodes (MatMul + bias Add -> Dense, Relu + Quant -> Relu with the quantized
    type), so a traced layer is compared with every QONNX tensor from its source node up to
    the next compute node; it matches when one of them is equal bit for bit."""
    with quiet_python(root_logger=False):
        _, trace = hm.trace(np.ascontiguousarray(x1.reshape(1, -1), dtype=np.float32))
    ctx = fq.qonnx_execute(mw, x1, full=True)
    nodes = list(mw.graph.node)
    index = {n.name: i for i, n in enumerate(nodes)}
    compute = ("MatMul", "Conv", "Relu", "MaxPool", "Flatten", "Add", "Sub", "Mul", "Concat", "LeakyRelu", "PRelu")
    producers = {o: n for n in nodes for o in n.output}

    def constant(t: str) -> bool:  # an initializer, or a Quant of one (a bias)
        p = producers.get(t)
        return mw.get_initializer(t) is not None or (p is not None and p.op_type == "Quant"
                                                     and mw.get_initializer(p.input[0]) is not None)

    def boundary(n) -> bool:  # a node hls4ml does not fuse into the layer before (a bias Add it does)
        return n.op_type in compute and not (n.op_type == "Add" and any(constant(i) for i in n.input))

    for name, value in trace.items():
        base = name.removesuffix("_act")
        for prefix in ("Dense_", "DepthwiseConv2D_", "DepthwiseConv1D_", "Conv2D_", "Conv1D_"):
            base = base.removeprefix(prefix)
        if base not in index or base == skip:
            continue  # hls4ml-only layer (zero padding, transposes), or the lookup table judged apart
        a = np.asarray(value, np.float64).reshape(-1)
        cands = []
        for k in range(index[base], len(nodes)):
            if k > index[base] and boundary(nodes[k]):
                break
            t = ctx.get(nodes[k].output[0])
            if t is not None and np.asarray(t).size == a.size:
                cands.append(np.asarray(t, np.float64).reshape(-1))
        if cands and not any(np.array_equal(a, c) for c in cands):
            diff = min(float(np.max(np.abs(a - c))) for c in cands)
            return f"hls4ml layer {name} (QONNX node {base}, {nodes[index[base]].op_type}; max |diff| {diff:.6g})"
    return None if skip is not None else "the output (every traced intermediate layer matches)"
