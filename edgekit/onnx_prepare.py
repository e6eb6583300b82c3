"""ONNX models as the targets need them: a static, folded graph.

Published ONNX files are rarely ready to convert: dynamic dimensions (``-1``, named, missing), a scalar
input that picks an ``If`` branch (a voice-activity model's ``sr``), weights stored as ``Constant`` nodes
(paddle2onnx), opset 11/12 (per-channel Q/DQ needs 13). :func:`prepare` fixes each input's shape, folds
``--const`` inputs into the graph, upgrades the opset, and lets onnxslim fold constants (which also
inlines an ``If`` whose condition became constant). The prepared file is what every target converts and
what the float reference (onnxruntime) runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import InputSpecError, ModelLoadError
from edgekit.onnx_rewrites import div_by_constant_to_mul, if_to_where

MIN_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear (axis) and Split/Squeeze as inputs
ONNX_DTYPES = {1: "float32", 10: "float16", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool",
               12: "uint32", 13: "uint64", 5: "int16", 4: "uint16"}
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
    "MatMulInteger", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool",
    "QLinearConcat", "QLinearAveragePool", "DynamicQuantizeLSTM", "QAttention", "DynamicQuantizeMatMul",
    "QGemm", "QLinearSoftmax",
})


@dataclass
class Prepared:
    proto: Any  # onnx.ModelProto, static shapes, folded
    inputs: list[tuple[str, tuple[int, ...], str]]  # name, shape, dtype (consts removed)
    consts: dict[str, list]  # name -> the folded value (as a list, for the manifest)
    steps: list[str] = field(default_factory=list)  # what was done, for the report / manifest
    quantized_ops: list[str] = field(default_factory=list)  # already-quantized ops found (QLinear*, Q/DQ, ...)


def _dims(vi) -> list[int | str | None]:
    out: list[int | str | None] = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)  # missing, or -1 / 0 written as a value
    return out


def _show(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def parse_consts(specs: list[str] | None) -> dict[str, np.ndarray]:
    """``--const sr=16000`` or ``--const mask=1,0,1`` (repeat per input)."""
    out: dict[str, np.ndarray] = {}
    for spec in specs or []:
        name, sep, val = spec.partition("=")
        if not sep or not name.strip() or not val.strip():
            raise InputSpecError(f"--const {spec!r}: expected NAME=VALUE, e.g. --const sr=16000")
        try:
            vals = [float(v) for v in val.split(",")]
        except ValueError:
            raise InputSpecError(f"--const {spec!r}: the value must be numbers, e.g. 16000 or 1,0,1") from None
        out[name.strip()] = np.array(vals[0] if len(vals) == 1 else vals)
    return out


def model_inputs(proto) -> list:
    init = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in init]


def prepare(path: Path, proto, shapes: list[tuple[str | None, tuple[int, ...]]],
            consts: dict[str, np.ndarray], batch_axes: dict[str, int | None] | None = None) -> Prepared:
    """The graph with every input static, ``consts`` folded in, opset >= 13 where it was lower, constants
    folded by onnxslim. A dynamic dimension on an input's batch axis (axis 0, or the one ``--batch-axis`` names in
    ``batch_axes``) is set to 1. Raises InputSpecError naming the input and the flag when a dimension is unknown."""
    onnx = require("onnx")
    from onnx import numpy_helper

    graph = proto.graph
    steps: list[str] = []
    inputs = model_inputs(proto)
    names = [i.name for i in inputs]
    for c in consts:
        if c not in names:
            raise InputSpecError(f"{path}: --const {c}: the model has no input {c!r} (its inputs: {', '.join(names)})")
    named = {n: s for n, s in shapes if n}
    positional = [s for n, s in shapes if not n]
    for n in named:
        if n not in names:
            raise InputSpecError(f"{path}: --input-shape {n}:...: the model has no input {n!r} "
                                 f"(its inputs: {', '.join(names)})")
    free = [i for i in inputs if i.name not in consts and i.name not in named]
    if positional and len(positional) != len(free):
        raise InputSpecError(
            f"{path}: the model has {len(free)} input(s) without a name in --input-shape, {len(positional)} "
            f"shape(s) were given by position; name them: --input-shape {free[0].name if free else 'x'}:1,3,224,224")
    given = dict(named)
    given.update({i.name: s for i, s in zip(free, positional, strict=False)})
    consts_record: dict[str, list] = {}
    out_inputs: list[tuple[str, tuple[int, ...], str]] = []
    for vi in inputs:
        tt = vi.type.tensor_type
        dtype = ONNX_DTYPES.get(tt.elem_type)
        if dtype is None:
            raise InputSpecError(f"{path}: input {vi.name!r} has ONNX element type {tt.elem_type}, which edgekit "
                                 "cannot feed (it takes float, int and bool tensors)")
        dims = _dims(vi) if tt.HasField("shape") else None
        if vi.name in consts:
            value = consts[vi.name].astype(dtype)
            if dims is not None and value.size == 1 and len(dims) > 1:  # a scalar fills the input (h=0: zero state)
                value = np.full([d if isinstance(d, int) else 1 for d in dims], value.reshape(-1)[0], dtype=dtype)
            if dims is not None and value.ndim != len(dims) and not (value.size == 1 and len(dims) <= 1):
                raise InputSpecError(f"{path}: --const {vi.name}: the input has shape {_show(dims)}, "
                                     f"the value has {value.size} element(s)")
            if dims is not None and len(dims) == 1 and value.ndim == 0:
                value = value.reshape(1)
            graph.input.remove(vi)
            graph.initializer.append(numpy_helper.from_array(value, vi.name))
            consts_record[vi.name] = value.tolist()
            steps.append(f"input {vi.name} folded as the constant {value.tolist()}")
            continue
        if vi.name in given:
            shape = given[vi.name]
            if dims is not None and (len(shape) != len(dims) or any(
                    isinstance(d, int) and d != s for d, s in zip(dims, shape, strict=False))):
                raise InputSpecError(f"{path}: input {vi.name!r} has shape {_show(dims)}; --input-shape "
                                     f"{vi.name}:{','.join(map(str, shape))} does not fit it")
        elif dims is None:
            raise InputSpecError(f"{path}: input {vi.name!r} has no shape in the file; give --input-shape "
                                 f"{vi.name}:D0,D1,...")
        else:
            unknown = [k for k, d in enumerate(dims) if not isinstance(d, int)]
            axis = (batch_axes or {}).get(vi.name, 0)
            if axis is not None and axis < 0:
                axis += len(dims)
            if unknown and unknown != [axis]:
                hint = (f", or, where that axis holds the batch (a recurrent state [layers, B, H]), "
                        f"--batch-axis {vi.name}={unknown[0]}" if len(unknown) == 1 and vi.name not in (batch_axes or {})
                        else "")
                raise InputSpecError(
                    f"{path}: input {vi.name!r} has dynamic dimensions {_show(dims)}; give its size for this "
                    f"board: --input-shape {vi.name}:{','.join('1' if k == axis and not isinstance(d, int) else str(d) if isinstance(d, int) else 'N' for k, d in enumerate(dims))}{hint}")
            shape = tuple(1 if not isinstance(d, int) else d for d in dims)  # dynamic batch: batch 1 on the edge
            if unknown:
                which = "first dimension" if axis == 0 else f"batch dimension (axis {axis})"
                steps.append(f"input {vi.name}: dynamic {which} {dims[axis] or '?'} set to 1")
        del tt.shape.dim[:]
        for s in shape:
            tt.shape.dim.add().dim_value = int(s)
        out_inputs.append((vi.name, tuple(int(s) for s in shape), dtype))
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    quantized = sorted({n.op_type for n in graph.node if n.op_type in QUANTIZED_OPS})
    if opset < MIN_OPSET and not quantized:
        try:
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
            steps.append(f"opset {opset} upgraded to {MIN_OPSET} (onnx version converter)")
        except Exception as exc:  # the converter raises RuntimeError / ValidationError per op
            steps.append(f"opset {opset} kept: the onnx version converter failed ({str(exc).splitlines()[0][:120]})")
    # a stale value_info of a dynamic graph would keep old shapes: shapes are inferred again after folding
    del proto.graph.value_info[:]
    for o in proto.graph.output:
        o.type.tensor_type.ClearField("shape")
    if not quantized:
        slim = require("onnxslim")
        before = len(proto.graph.node)
        try:
            from edgekit.quiet import quiet_loggers
            with quiet_loggers("onnxslim"):
                proto = slim.slim(proto)
        except Exception as exc:  # onnxslim raises many types on graphs it cannot fold
            raise ModelLoadError(f"{path}: folding the graph at the given shapes failed ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200]}); check --input-shape / --const") from None
        steps.append(f"constants folded at the fixed shapes (onnxslim): {before} -> {len(proto.graph.node)} nodes")
        divs = div_by_constant_to_mul(proto)
        if divs:
            steps.append(f"{divs} Div by a constant rewritten as Mul by its reciprocal (int8 kernels: MUL, not DIV)")
        from edgekit.onnx_fuse import fold_affine_into_conv

        folded = fold_affine_into_conv(proto)
        if folded:
            steps.append(f"{folded} Mul/Add by a per-channel constant folded into the Conv before it (exact; fewer "
                         "int8 rounding points)")
        selected = if_to_where(proto)
        if selected:
            steps.append(f"If node(s) {', '.join(selected)} with a data-dependent condition: both branches computed, "
                         "the result selected with Where (the targets' runtimes have no control flow)")
    else:
        steps.append(f"already quantized ({', '.join(quantized)}): the graph is taken as it is")
    try:
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # shape inference is best effort; onnxruntime checks the graph next
        pass
    return Prepared(proto, out_inputs, consts_record, steps, quantized)


_SCRATCH: list = []


def save_prepared(prep: Prepared, digest: str) -> Path:
    """The prepared graph as a new file in the scratch folder: one per load (two loads of one file with other
    shapes or --const values must not overwrite each other's graph while a Model still points at it)."""
    import os
    import tempfile

    onnx = require("onnx")
    fd, name = tempfile.mkstemp(prefix=f"{digest[:16]}-", suffix="-prepared.onnx", dir=scratch_dir())
    os.close(fd)
    onnx.save(prep.proto, name)
    return Path(name)


def scratch_dir() -> Path:
    """A work folder for this process's prepared graphs (edgekit.fsutil.work_dir: removed at exit, swept by
    the next run after a kill)."""
    if not _SCRATCH:
        import atexit
        import contextlib

        from edgekit.fsutil import work_dir

        stack = contextlib.ExitStack()
        _SCRATCH.append((stack.enter_context(work_dir("edgekit-onnx-")), stack))
        atexit.register(stack.close)
    return _SCRATCH[0][0]
