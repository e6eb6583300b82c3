"""Analyze: per-layer parameters, MACs, activation bytes, and peak live memory.

Works on the float ONNX graph (torch and ONNX input), with ONNX shape inference for
tensor sizes, or on the float ``.tflite`` that TensorFlow's TFLiteConverter writes
(Keras / SavedModel input, android target only), where every tensor shape is static.
:func:`analyze_model` picks the graph by the model's kind; the pipeline and
``edgekit inspect`` both call it. Peak activation memory is a liveness walk over the graph
in execution order: a tensor is live from the node that makes it to its last reader
(graph outputs stay live), so the peak is what a runtime without in-place reuse must
hold at once — not the sum of all tensors.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.onnx_fuse import subgraphs as _subgraphs

DTYPE_BYTES = {1: 4, 10: 2, 11: 8, 7: 8, 6: 4, 5: 2, 4: 2, 3: 1, 2: 1, 9: 1, 16: 2}
ONNX_WEIGHT_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
TFLITE_WEIGHT_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "CONV_3D", "BATCH_MATMUL"}
WEIGHT_OPS = ONNX_WEIGHT_OPS | TFLITE_WEIGHT_OPS  # layers of either graph (ONNX op types, TFLite builtins)
# op classes the cost model gives their own efficiency (edgekit.costmodel)
CONV_OPS = {"Conv", "ConvTranspose", "CONV_2D", "CONV_3D", "TRANSPOSE_CONV"}
GEMM_OPS = {"Gemm", "MatMul", "FULLY_CONNECTED", "BATCH_MATMUL"}


@dataclass
class LayerStats:
    name: str
    op: str
    params: int
    macs: int
    output_shape: list[int]
    activation_bytes: int
    groups: int = 1  # Conv groups (> 1: grouped / depthwise; the cost model's "dwconv" class)
    input_shape: list[int] = field(default_factory=list)  # the first input's (ONNX graphs; [] where unknown)

    @property
    def op_class(self) -> str:
        """conv | dwconv | gemm | other (no MACs): which efficiency the cost model runs the layer at."""
        if self.op == "DEPTHWISE_CONV_2D" or (self.op in CONV_OPS and self.groups > 1):
            return "dwconv"
        if self.op in CONV_OPS:
            return "conv"
        return "gemm" if self.op in GEMM_OPS else "other"


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


def analyze_model(model: Any, work_dir: Path, target: Any = None, opset: int | None = None) -> tuple[ModelStats, Path]:
    """The analyze stage for every ingest kind: (stats, the float graph that was analyzed).

    torch -> ONNX export (reused by ONNX-based converters), ONNX -> the file itself,
    Keras / SavedModel -> fp32 ``.tflite`` from TFLiteConverter (reused by the android converter).
    ``target`` (a Target profile) adds its op-support check.
    """
    from edgekit.ingest import check_target_takes

    check_target_takes(model, target)
    name = target.name if target is not None else None
    if model.is_tf:
        from edgekit.tf_graph import tf_convert

        path = Path(work_dir) / "float.tflite"
        t0 = time.perf_counter()
        info = tf_convert(model, path, "fp32", work_dir=Path(work_dir))
        info["conversion_s"] = round(time.perf_counter() - t0, 2)
        # the android converter reuses this fp32 .tflite (and its record) instead of converting twice
        path.with_name(path.name + ".json").write_text(json.dumps(info))
        return analyze_tflite(path, target.supported_tflite_ops if target is not None else None, name), path
    if model.is_torch:
        from edgekit.onnx_graph import export_onnx

        path = export_onnx(model, Path(work_dir) / "analysis.onnx",
                           opset or (target.opset if target is not None else None) or 18)
    else:
        path = Path(model.onnx_path)
    return analyze_onnx(path, target.supported_ops if target is not None else None, name,
                        target.rewrites if target is not None else None), path


def _rewritable(nodes: list[Any], consts: dict[str, Any], numpy_helper: Any, rewrites: list[str]) -> set[int]:
    """The nodes (by id) the target's converter rewrites into ops it runs (``Target.rewrites``), so the op check
    does not refuse them: ``Pow``: a square (constant exponent 2) -> x * x; ``Sqrt`` whose every reader divides
    by it, and that ``Div`` -> a * rsqrt(b); ``Div`` by a constant -> a * (1 / c); ``ConvTranspose`` whose kernel
    equals its stride -> a 1x1 conv and a pixel shuffle. A LayerNorm written out
    (ReduceMean, Sub, Pow 2, ReduceMean, Add, Sqrt, Div, as paddle2onnx and older exporters write it) is such."""
    import numpy as np

    def value(name: str) -> Any:
        t = consts.get(name)
        return None if t is None else numpy_helper.to_array(t)

    readers: dict[str, list[Any]] = {}
    for n in nodes:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out: set[int] = set()
    sqrts: set[str] = set()  # outputs of the Sqrt nodes rewritten (read only as a divisor)
    for n in nodes:
        if n.op_type == "Pow" and "Pow" in rewrites and len(n.input) == 2:
            e = value(n.input[1])
            if e is not None and e.size == 1 and float(e.reshape(-1)[0]) == 2.0:
                out.add(id(n))
        elif n.op_type == "Sqrt" and {"Sqrt", "Div"} <= set(rewrites) and n.output:
            users = readers.get(n.output[0], [])
            if users and all(u.op_type == "Div" and len(u.input) == 2 and u.input[1] == n.output[0]
                             and u.input[0] != n.output[0] for u in users):
                out.add(id(n))
                sqrts.add(n.output[0])
        elif n.op_type == "ConvTranspose" and "ConvTranspose" in rewrites and _upsampling(n, value):
            out.add(id(n))
    for n in nodes:  # a Div by a constant, or by a Sqrt rewritten above (together they become a * rsqrt(b))
        if n.op_type == "Div" and "Div" in rewrites and len(n.input) == 2:
            c = value(n.input[1])
            if (c is not None and np.all(np.asarray(c, dtype=np.float64) != 0)) or n.input[1] in sqrts:
                out.add(id(n))
    return out


def _upsampling(n: Any, value: Any) -> bool:
    """A 2-D ConvTranspose whose square kernel equals its stride, with no padding, output padding, dilation or
    groups and constant weights: an r x r up-sampling the converter computes as a 1x1 conv and a pixel shuffle."""
    from onnx import helper

    at = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    w = value(n.input[1]) if len(n.input) > 1 else None
    if w is None or w.ndim != 4 or (len(n.input) > 2 and n.input[2] and value(n.input[2]) is None):
        return False
    k = list(at.get("kernel_shape") or w.shape[2:])
    return (k[0] == k[1] == w.shape[2] == w.shape[3] > 1 and list(at.get("strides") or [1, 1]) == k
            and not any(at.get("pads") or []) and not any(at.get("output_padding") or [])
            and int(at.get("group", 1)) == 1 and all(d == 1 for d in at.get("dilations") or [1])
            and "output_shape" not in at and at.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"))


def analyze_onnx(path: Path, supported_ops: list[str] | None = None, target: str | None = None,
                 rewrites: list[str] | None = None) -> ModelStats:
    onnx = require("onnx")
    from onnx import numpy_helper, shape_inference

    proto = onnx.load(str(path))
    proto = shape_inference.infer_shapes(proto, data_prop=True)
    g = proto.graph
    inits = {i.name: i for i in g.initializer}
    # Constant nodes also carry weights in exported graphs; If branches and Loop/Scan bodies hold nodes,
    # initializers and Constants of their own, and use the outer graph's weights: each top-level node counts
    # what its subgraphs hold and use (a whole network may sit in the branches of one If)
    subgraphs = [sg for n in g.node for sg in _subgraphs(n)]
    for sg in subgraphs:
        inits.update({i.name: i for i in sg.initializer})
    const_vals: dict[str, Any] = {}
    for n in list(g.node) + [m for sg in subgraphs for m in sg.node]:
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
        inner = [m for sg in _subgraphs(n) for m in sg.node if m.op_type != "Constant"]
        for m in [n] + inner:
            ops[m.op_type] = ops.get(m.op_type, 0) + 1
        p = 0
        for m, j, inp in [(m, j, inp) for m in [n] + inner for j, inp in enumerate(m.input)]:
            if inp in weight_names and inp not in counted:
                counted.add(inp)
                t = inits.get(inp) or const_vals[inp]
                if t.data_type not in (1, 10, 11, 16, 3, 2):  # float or int8 weights only
                    continue
                k = numel(inp)
                if k <= 1:
                    continue
                p += k
                if m.op_type in ONNX_WEIGHT_OPS and j == 1:
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
                groups=next((a.i for a in n.attribute if a.name == "group"), 1) if n.op_type == "Conv" else 1,
                input_shape=list(shapes.get(n.input[0], ([], 4))[0]) if n.input else [],
            )
        )

    graph_inputs = [i.name for i in g.input if i.name not in weight_names]
    steps = [([i for i in n.input if i and i not in weight_names], [o for o in n.output if o and o not in weight_names])
             for n in g.node if n.op_type != "Constant"]
    peak, total = _liveness(steps, graph_inputs, {o.name for o in g.output}, nbytes)
    unsupported = []
    if supported_ops is not None:
        allowed = set(supported_ops)
        nodes = list(g.node) + [m for sg in subgraphs for m in sg.node if m.op_type != "Constant"]
        rewritten = _rewritable(nodes, {**inits, **const_vals}, numpy_helper, rewrites or [])
        for n in nodes:
            key = n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}::{n.op_type}"
            if key not in allowed and id(n) not in rewritten:
                unsupported.append({"op": key, "node": n.name or "(unnamed)"})
    return _model_stats(layers, weight_params, other_params, peak, total, sum(nbytes(i) for i in graph_inputs),
                        ops, unsupported, target)


def _model_stats(layers: list[LayerStats], weight_params: int, other_params: int, peak: int, total: int,
                 input_bytes: int, ops: dict[str, int], unsupported: list[dict[str, str]],
                 target: str | None) -> ModelStats:
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


def _liveness(steps: list[tuple[list[Any], list[Any]]], graph_inputs: list[Any], graph_outputs: set[Any],
              nbytes) -> tuple[int, int]:
    """Peak and total bytes of activations. ``steps``: each node's (activation inputs, activation
    outputs) in execution order, weights and constants left out; a tensor is live from the step
    that makes it (graph inputs: from the start) to its last reader, graph outputs to the end."""
    last_use: dict[Any, int] = {}
    for k, (ins, _) in enumerate(steps):
        for i in ins:
            last_use[i] = k
    live = {i: nbytes(i) for i in graph_inputs}
    peak = total = sum(live.values())
    for k, (_, outs) in enumerate(steps):
        for o in outs:
            live[o] = nbytes(o)
            total += live[o]
        peak = max(peak, sum(live.values()))
        for t in list(live):
            if t not in graph_outputs and last_use.get(t, -1) <= k:
                del live[t]
    return peak, total


# ---------------------------------------------------------------- float .tflite (Keras / SavedModel input)

TFLITE_TYPE_BYTES = {"FLOAT32": 4, "FLOAT16": 2, "FLOAT64": 8, "INT8": 1, "UINT8": 1, "INT16": 2, "INT32": 4,
                     "INT64": 8, "BOOL": 1}


def analyze_tflite(path: Path, supported_ops: list[str] | None = None, target: str | None = None) -> ModelStats:
    """Per-op parameters, MACs and activation bytes of a float ``.tflite`` (shapes are static there).

    Layers are the flatbuffer's operators in execution order (TFLiteConverter has folded
    BatchNorm into the convolutions and fused activations, as the board will run it); weights
    are the constant float inputs (index 1 of CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED /
    TRANSPOSE_CONV; biases and other constants count as other parameters); int32/int64
    constants (shapes, axes) are not parameters.
    """
    from edgekit.tflite_graph import TFLiteGraph

    g = TFLiteGraph(path)

    def dims(i: int) -> list[int]:
        return [int(d) for d in g.sg.tensors[i].shape] if g.sg.tensors[i].shape is not None else []

    def numel(i: int) -> int:
        return int(np.prod(dims(i), dtype=np.int64)) if dims(i) else 1

    def nbytes(i: int) -> int:
        return numel(i) * TFLITE_TYPE_BYTES.get(g.type_name(i), 4)

    const = {i for i in range(len(g.sg.tensors)) if g.is_const(i)}
    counted: set[int] = set()
    layers: list[LayerStats] = []
    ops: dict[str, int] = {}
    unsupported: list[dict[str, str]] = []
    allowed = set(supported_ops) if supported_ops is not None else None
    weight_params = other_params = 0
    steps: list[tuple[list[int], list[int]]] = []
    for k, (name, ins, outs) in enumerate(g.operators()):
        steps.append(([i for i in ins if i not in const], [o for o in outs if o not in const]))
        ops[name] = ops.get(name, 0) + 1
        p = 0
        for j, i in enumerate(ins):
            if i not in const or i in counted:
                continue
            counted.add(i)
            if g.type_name(i) in ("INT32", "INT64", "BOOL") or numel(i) <= 1:
                continue
            p += numel(i)
            if name in TFLITE_WEIGHT_OPS and j == 1:
                weight_params += numel(i)
            else:
                other_params += numel(i)
        node = g.tensor_name(outs[0]) if outs else f"{name}_{k}"
        layers.append(LayerStats(name=node, op=name, params=p, macs=_tflite_macs(name, ins, outs, dims, numel),
                                 output_shape=dims(outs[0]) if outs else [],
                                 activation_bytes=sum(nbytes(o) for o in outs)))
        if allowed is not None and name not in allowed:
            unsupported.append({"op": name, "node": node})
    graph_inputs = [int(i) for i in g.sg.inputs]
    peak, total = _liveness(steps, graph_inputs, {int(o) for o in g.sg.outputs}, nbytes)
    return _model_stats(layers, weight_params, other_params, peak, total, sum(nbytes(i) for i in graph_inputs),
                        ops, unsupported, target)


def _tflite_macs(op: str, ins: list[int], outs: list[int], dims, numel) -> int:
    if not outs or len(ins) < 2:
        return 0
    w = dims(ins[1])
    if op == "CONV_2D" and len(w) == 4:  # weights [Cout, KH, KW, Cin/groups]
        return numel(outs[0]) * w[1] * w[2] * w[3]
    if op == "DEPTHWISE_CONV_2D" and len(w) == 4:  # weights [1, KH, KW, Cout]
        return numel(outs[0]) * w[1] * w[2]
    if op == "FULLY_CONNECTED" and len(w) == 2:  # weights [Cout, Cin]
        return numel(outs[0]) * w[1]
    if op == "TRANSPOSE_CONV" and len(w) == 4 and len(ins) > 2:  # (output_shape, weights [Cout,KH,KW,Cin], input)
        return numel(ins[2]) * w[0] * w[1] * w[2]
    if op == "CONV_3D" and len(w) == 5:  # weights [KD, KH, KW, Cin, Cout]
        return numel(outs[0]) * w[0] * w[1] * w[2] * w[3]
    if op == "BATCH_MATMUL":
        a = dims(ins[0])
        return numel(outs[0]) * a[-1] if a else 0
    return 0
