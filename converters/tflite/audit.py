"""The audit of a written .tflite (every op with its tensor types: float ops, TRANSPOSEs and where they sit, ops
no int8 delegate takes) and its float-I/O rewrite (``--option io=float``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.tflite_graph import TFLiteGraph, text

# TFLite builtins with int8 kernels that XNNPACK (CPU), the GPU delegate (via dequant) and
# NNAPI take (TFLite op versions docs, xnnpack/README.md "Quantized operators").
INT8_DELEGATE_OPS = {
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEPTH_TO_SPACE",
    "FULLY_CONNECTED", "LEAKY_RELU", "LOGISTIC", "MAX_POOL_2D", "MAXIMUM", "MEAN",
    "MINIMUM", "MUL", "PAD", "PADV2", "RELU", "RELU6", "RELU_N1_TO_1", "RESHAPE", "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR", "SLICE", "SOFTMAX", "SPACE_TO_DEPTH", "SPLIT", "SQUEEZE",
    "STRIDED_SLICE", "SUB", "TANH", "TRANSPOSE", "TRANSPOSE_CONV", "ELU", "PRELU", "BATCH_MATMUL",
}
_FLOAT_TYPES = {"FLOAT32", "FLOAT16", "FLOAT64"}


def audit(path: Path, float_io_ok: bool = False) -> dict[str, Any]:
    """Every op of the .tflite with its tensor types; float ops, TRANSPOSEs and where they sit.
    With ``float_io_ok``, the QUANTIZE at an input and the DEQUANTIZE at an output are not float ops."""
    g = TFLiteGraph(path)
    graph_in, graph_out = set(g.sg.inputs), set(g.sg.outputs)
    ops, counts = [], {}
    for k, (name, ins, outs) in enumerate(g.operators()):
        act_ins = [i for i in ins if not g.is_const(i)]
        types = sorted({g.type_name(i) for i in act_ins + outs})
        counts[name] = counts.get(name, 0) + 1
        ops.append({"index": k, "op": name, "types": types, "node": g.tensor_name(outs[0]) if outs else "",
                    "at_input": any(i in graph_in for i in ins), "at_output": any(o in graph_out for o in outs)})
    float_ops = [o for o in ops if set(o["types"]) & _FLOAT_TYPES
                 and not (float_io_ok and ((o["op"] == "QUANTIZE" and o["at_input"])
                                           or (o["op"] == "DEQUANTIZE" and o["at_output"])))]
    transposes = [o for o in ops if o["op"] == "TRANSPOSE"]
    edge = [o for o in transposes if o["at_input"] or o["at_output"]]
    io_t = {"inputs": [_tensor_info(g, i) for i in g.sg.inputs], "outputs": [_tensor_info(g, i) for i in g.sg.outputs]}
    return {
        "ops": ops, "op_counts": counts, "float_ops": float_ops,
        "transpose": {"total": len(transposes), "at_edges": len(edge), "interior": len(transposes) - len(edge)},
        "not_delegable_int8": sorted({o["op"] for o in ops if o["op"] not in INT8_DELEGATE_OPS
                                      and o["op"] not in ("QUANTIZE", "DEQUANTIZE")}),
        "io": io_t,
    }


def _tensor_info(g: TFLiteGraph, i: int) -> dict[str, Any]:
    t = g.sg.tensors[i]
    q = t.quantization
    scale = [float(x) for x in q.scale] if q is not None and q.scale is not None else []
    zp = [int(x) for x in q.zeroPoint] if q is not None and q.zeroPoint is not None else []
    return {"name": g.tensor_name(i), "dtype": g.type_name(i).lower(), "shape": [int(d) for d in t.shape],
            "scale": scale[0] if len(scale) == 1 else (scale or None),
            "zero_point": zp[0] if len(zp) == 1 else (zp or None)}


def float_counts(float_ops: list[dict[str, Any]]) -> str:
    """Float ops counted by op type, e.g. "HARD_SWISHx18, DEQUANTIZEx27"."""
    counts: dict[str, int] = {}
    for o in float_ops:
        counts[o["op"]] = counts.get(o["op"], 0) + 1
    return ", ".join(f"{k}x{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def short_node(node: str, width: int = 80) -> str:
    """A long TFLite node name cut at a path separator, not mid-word."""
    if len(node) <= width:
        return node
    tail = node[-width:]
    cut = min((i for i in (tail.find("/"), tail.find(";")) if i >= 0), default=-1)
    return "…" + (tail[cut + 1:] if cut >= 0 else tail)


def format_float_ops(float_ops: list[dict[str, Any]], limit: int = 12) -> str:
    shown = [f"{o['op']} ({'/'.join(o['types'])}, node {short_node(o['node'])})" for o in float_ops[:limit]]
    more = f" and {len(float_ops) - limit} more" if len(float_ops) > limit else ""
    return "; ".join(shown) + more


def float_io(path: Path) -> int:
    """Give an int8 .tflite float32 input/output tensors: QUANTIZE after each int8 input and
    DEQUANTIZE before each int8 output, with the tensors' own scale and zero point (the
    "--io float" build). Returns the number of edges changed. Rewrites ``path``."""
    import copy

    g = TFLiteGraph(path)
    s, model, sg = g.schema, g.model, g.sg

    def float_twin(i: int) -> int:
        t = copy.deepcopy(sg.tensors[i])
        t.type, t.quantization = s.TensorType.FLOAT32, None
        t.name = text(t.name) + "_float"
        buf = s.BufferT()
        model.buffers.append(buf)
        t.buffer = len(model.buffers) - 1
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    remap: dict[int, int] = {}
    head, tail = [], []
    sg.inputs, sg.outputs = [int(i) for i in sg.inputs], [int(i) for i in sg.outputs]
    quantized = (s.TensorType.INT8, s.TensorType.INT16)
    for k, i in enumerate(list(sg.inputs)):
        if sg.tensors[i].type not in quantized:
            continue
        f = float_twin(i)
        op = s.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = g.opcode(s.BuiltinOperator.QUANTIZE, 1), [f], [i]
        head.append(op)
        sg.inputs[k] = remap[i] = f
    for k, i in enumerate(list(sg.outputs)):
        if sg.tensors[i].type not in quantized:
            continue
        f = float_twin(i)
        op = s.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = g.opcode(s.BuiltinOperator.DEQUANTIZE, 2), [i], [f]
        tail.append(op)
        sg.outputs[k] = remap[i] = f
    sg.operators = head + list(sg.operators) + tail
    for sig in model.signatureDefs or []:
        for tm in list(sig.inputs or []) + list(sig.outputs or []):
            tm.tensorIndex = remap.get(tm.tensorIndex, tm.tensorIndex)
    g.save(path)
    return len(remap)
