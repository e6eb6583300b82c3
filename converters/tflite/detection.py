"""A detection head's output in float in an int8 ``.tflite``: boxes and scores each dequantized at a scale of
their own, then concatenated in float.

A YOLO head ends in a concatenation of boxes (pixels: 0..640) and scores (0..1). TFLite's int8
CONCATENATION takes every input at its output's one scale, so the scores fall on the boxes' steps (a 32-px
range puts them on steps of 0.12; a 640-px one on steps of 2.5: every score is 0 or 2.5) and the detections
move. Kept float in the PT2E program, the converter still makes that concatenation int8 (it propagates the
scale through ops that keep it). So the built model is edited: the ops that assemble the output
(CONCATENATION, and RESHAPE / TRANSPOSE between them) become float, and each tensor that feeds them is
dequantized where it is made; a requantization that only moved a tensor onto the concatenation's scale (a
RELU or QUANTIZE of a LOGISTIC / SOFTMAX output, fixed at 1/256) is read before it, at its own scale. The
output becomes float32; the head's few float ops cost little beside its int8 convolutions.
"""

from __future__ import annotations

import copy
from pathlib import Path

from edgekit.tflite_graph import TFLiteGraph, text

ASSEMBLE = ("CONCATENATION", "RESHAPE", "TRANSPOSE")
FIXED_SCALE = ("LOGISTIC", "SOFTMAX")
REQUANT = ("RELU", "QUANTIZE")


def float_detection_outputs(path: Path, outputs: list[int]) -> list[str]:
    """Make the graph outputs at positions ``outputs`` (detection heads ending in a CONCATENATION) float as the
    module says; rewrites ``path``. Returns the names of the ops made float (empty where none was changed)."""
    g = TFLiteGraph(path)
    s, model, sg = g.schema, g.model, g.sg
    ops = list(sg.operators)
    names = [g.op_name(op) for op in ops]
    producer = {int(o): k for k, op in enumerate(ops) for o in (op.outputs if op.outputs is not None else [])}
    readers: dict[int, list[int]] = {}
    for k, op in enumerate(ops):
        for i in op.inputs if op.inputs is not None else []:
            readers.setdefault(int(i), []).append(k)
    quantized = (s.TensorType.INT8, s.TensorType.INT16)
    graph_out = [int(i) for i in sg.outputs]

    def is_q(i: int) -> bool:
        return sg.tensors[i].type in quantized

    # the ops that assemble each output: from its CONCATENATION back through ASSEMBLE ops read by nothing else
    assemble: set[int] = set()
    for pos in outputs:
        t = graph_out[pos] if pos < len(graph_out) else None
        k = producer.get(t) if t is not None else None
        if k is None or names[k] != "CONCATENATION" or sg.tensors[t].type not in quantized:
            continue
        todo = [k]
        while todo:
            k = todo.pop()
            if k in assemble:
                continue
            assemble.add(k)
            for i in _data_inputs(g, ops[k], names[k]):
                i, _ = _own_scale(ops, names, producer, readers, i, k, is_q)
                p = producer.get(i)
                if p is not None and names[p] in ASSEMBLE and len(readers.get(i, [])) == 1:
                    todo.append(p)
    if not assemble:
        return []

    inside = {int(o) for k in assemble for o in ops[k].outputs}
    dequantized: dict[int, int] = {}
    new_ops: dict[int, list] = {}  # op index -> DEQUANTIZE ops to run before it
    skipped: set[int] = set()  # requantizations read no more
    for k in sorted(assemble):
        op = ops[k]
        op.inputs = [int(i) for i in op.inputs]
        for n, i in enumerate(op.inputs):
            i = int(i)
            if i < 0 or i in inside or g.is_const(i) or i not in _data_inputs(g, op, names[k]):
                continue
            src, passed = _own_scale(ops, names, producer, readers, i, k, is_q)
            skipped |= passed
            if src in inside:
                op.inputs[n] = src
                continue
            if src not in dequantized:
                f = copy.deepcopy(sg.tensors[src])
                f.type, f.quantization = s.TensorType.FLOAT32, None
                f.name = text(f.name) + "_dequantized"
                model.buffers.append(s.BufferT())
                f.buffer = len(model.buffers) - 1
                sg.tensors.append(f)
                dq = s.OperatorT()
                dq.opcodeIndex, dq.inputs, dq.outputs = g.opcode(s.BuiltinOperator.DEQUANTIZE, 2), [src], [
                    len(sg.tensors) - 1]
                new_ops.setdefault(k, []).append(dq)
                dequantized[src] = len(sg.tensors) - 1
            op.inputs[n] = dequantized[src]
        for o in op.outputs:
            t = sg.tensors[int(o)]
            t.type, t.quantization = s.TensorType.FLOAT32, None
    order = []
    for k, op in enumerate(ops):
        order.extend(new_ops.get(k, []))
        if k not in skipped:
            order.append(op)
    sg.operators = order
    g.save(path)
    return [f"{names[k]} (op {k})" for k in sorted(assemble)]


def _data_inputs(g: TFLiteGraph, op, name: str) -> list[int]:
    """The op's activation inputs (RESHAPE's shape and TRANSPOSE's permutation are not data)."""
    ins = [int(i) for i in (op.inputs if op.inputs is not None else []) if i >= 0]
    if name in ("RESHAPE", "TRANSPOSE"):
        ins = ins[:1]
    return [i for i in ins if not g.is_const(i)]


def _own_scale(ops, names, producer, readers, i: int, reader: int, quantized=None) -> tuple[int, set[int]]:
    """The tensor to read for input ``i`` of ``reader``, and the ops passed over to reach it: before each
    requantization read only there (a QUANTIZE from int8 to int8, or a RELU of a LOGISTIC / SOFTMAX output, fixed
    at 1/256) that moved a tensor onto the concatenation's scale, the tensor at its own scale."""
    passed: set[int] = set()
    while True:
        p = producer.get(i)
        if p is None or readers.get(i, []) != [reader] or names[p] not in REQUANT:
            return i, passed
        src = int(ops[p].inputs[0])
        q = producer.get(src)
        if names[p] == "RELU" and (q is None or names[q] not in FIXED_SCALE):
            return i, passed
        if quantized is not None and not quantized(src):  # a QUANTIZE from float: the graph's own edge
            return i, passed
        passed.add(p)
        i, reader = src, p
