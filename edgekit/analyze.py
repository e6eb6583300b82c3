"""Analyze: per-layer parameters, MACs, activation bytes, and peak live memory.

Works on the float ONNX graph (every ingest kind reaches it), with ONNX shape
inference for tensor sizes. Peak activation memory is a liveness walk over the graph
in execution order: a tensor is live from the node that makes it to its last reader
(graph outputs stay live), so the peak is what a runtime without in-place reuse must
hold at once — not the sum of all tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require

DTYPE_BYTES = {1: 4, 10: 2, 11: 8, 7: 8, 6: 4, 5: 2, 4: 2, 3: 1, 2: 1, 9: 1, 16: 2}
WEIGHT_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


@dataclass
class LayerStats:
    name: str
    op: str
    params: int
    macs: int
    output_shape: list[int]
    activation_bytes: int


@dataclass
class ModelStats:
    params: int
    macs: int
    weight_params: int  # in Conv/Gemm/MatMul weights (quantizable)
    other_params: int  # biases, norms, ...
    weight_bytes: dict[str, int]
    peak_activation_bytes: int
    total_activation_bytes: int
    input_bytes: int
    layers: list[LayerStats] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    unsupported: list[dict[str, str]] = field(default_factory=list)
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def weight_bytes_per_precision(weight_params: int, other_params: int) -> dict[str, int]:
    """Storage of the weights at each precision.

    Conv/Gemm/MatMul weights take the precision's width; the other parameters
    (biases, norms) stay fp32 for int8/int4 (biases become int32 in INT8 runtimes) and
    fp16 for fp16. Quantization scales are small and not counted.
    """
    return {
        "fp32": 4 * (weight_params + other_params),
        "fp16": 2 * (weight_params + other_params),
        "int8": weight_params + 4 * other_params,
        "int4": (weight_params + 1) // 2 + 4 * other_params,
    }


def analyze_onnx(path: Path, supported_ops: list[str] | None = None, target: str | None = None) -> ModelStats:
    onnx = require("onnx")
    from onnx import numpy_helper, shape_inference

    proto = onnx.load(str(path))
    proto = shape_inference.infer_shapes(proto, data_prop=True)
    g = proto.graph
    inits = {i.name: i for i in g.initializer}
    # Constant nodes also carry weights in exported graphs
    const_vals: dict[str, Any] = {}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            const_vals[n.output[0]] = n.attribute[0].t

    shapes: dict[str, tuple[list[int], int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
            shapes[vi.name] = (dims, DTYPE_BYTES.get(tt.elem_type, 4))
    for name, t in {**inits, **const_vals}.items():
        shapes[name] = (list(t.dims), DTYPE_BYTES.get(t.data_type, 4))

    def nbytes(name: str) -> int:
        if name not in shapes:
            return 0
        dims, b = shapes[name]
        return int(np.prod(dims, dtype=np.int64)) * b if dims else b

    def numel(name: str) -> int:
        dims = shapes.get(name, ([], 4))[0]
        return int(np.prod(dims, dtype=np.int64)) if dims else 1

    weight_names = set(inits) | set(const_vals)
    counted: set[str] = set()
    layers: list[LayerStats] = []
    weight_params = other_params = 0
    ops: dict[str, int] = {}
    for idx, n in enumerate(g.node):
        if n.op_type == "Constant":
            continue
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
        p = 0
        for j, inp in enumerate(n.input):
            if inp in weight_names and inp not in counted:
                counted.add(inp)
                t = inits.get(inp) or const_vals[inp]
                if t.data_type not in (1, 10, 11, 16, 3, 2):  # float or int8 weights only
                    continue
                k = numel(inp)
                if k <= 1:
                    continue
                p += k
                if n.op_type in WEIGHT_OPS and j == 1:
                    weight_params += k
                else:
                    other_params += k
        out = n.output[0] if n.output else ""
        out_dims = shapes.get(out, ([], 4))[0]
        macs = _macs(n, shapes, numel, numpy_helper)
        layers.append(
            LayerStats(
                name=n.name or f"{n.op_type}_{idx}",
                op=n.op_type,
                params=p,
                macs=macs,
                output_shape=list(out_dims),
                activation_bytes=sum(nbytes(o) for o in n.output),
            )
        )

    peak, total = _liveness(g, weight_names, nbytes)
    init_names = set(inits)
    input_bytes = sum(nbytes(i.name) for i in g.input if i.name not in init_names)
    unsupported = []
    if supported_ops is not None:
        allowed = set(supported_ops)
        for n in g.node:
            key = n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}::{n.op_type}"
            if key not in allowed:
                unsupported.append({"op": key, "node": n.name or "(unnamed)"})
    return ModelStats(
        params=weight_params + other_params,
        macs=sum(layer.macs for layer in layers),
        weight_params=weight_params,
        other_params=other_params,
        weight_bytes=weight_bytes_per_precision(weight_params, other_params),
        peak_activation_bytes=peak,
        total_activation_bytes=total,
        input_bytes=input_bytes,
        layers=layers,
        ops=dict(sorted(ops.items())),
        unsupported=unsupported,
        target=target,
    )


def _macs(n, shapes, numel, numpy_helper) -> int:
    def dims(name):
        return shapes.get(name, ([], 4))[0]

    if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1:
        w = dims(n.input[1])
        if len(w) < 3:
            return 0
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        kernel = int(np.prod(w[2:]))
        if n.op_type == "Conv":
            # out elements x (Cin/group) x kernel
            return numel(n.output[0]) * w[1] * kernel
        # ConvTranspose: in elements x (Cout/group) x kernel
        return numel(n.input[0]) * w[1] * kernel
    if n.op_type in ("Gemm", "MatMul") and len(n.input) > 1:
        a, b = dims(n.input[0]), dims(n.input[1])
        if not a or not b:
            return 0
        trans_a = n.op_type == "Gemm" and any(x.name == "transA" and x.i for x in n.attribute)
        k = a[-2] if trans_a else a[-1]
        return numel(n.output[0]) * k
    return 0


def _liveness(g, weight_names: set[str], nbytes) -> tuple[int, int]:
    """Peak and total bytes of activations (inputs and intermediates, not weights)."""
    last_use: dict[str, int] = {}
    for i, n in enumerate(g.node):
        for inp in n.input:
            if inp and inp not in weight_names:
                last_use[inp] = i
    outputs = {o.name for o in g.output}
    live: dict[str, int] = {}
    for vi in g.input:
        if vi.name not in weight_names:
            live[vi.name] = nbytes(vi.name)
    peak = sum(live.values())
    total = peak
    for i, n in enumerate(g.node):
        if n.op_type == "Constant":
            continue
        for o in n.output:
            if o and o not in weight_names:
                live[o] = nbytes(o)
                total += live[o]
        peak = max(peak, sum(live.values()))
        for name in list(live):
            if name not in outputs and last_use.get(name, -1) <= i:
                del live[name]
    return peak, total
