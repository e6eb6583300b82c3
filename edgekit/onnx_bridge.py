"""ONNX models as the targets need them: a static, folded graph, and (for targets whose converter reads
torch) the same graph as a torch ExportedProgram.

Published ONNX files are rarely ready to convert: dynamic dimensions (``-1``, named, missing), a scalar
input that picks an ``If`` branch (a voice-activity model's ``sr``), weights stored as ``Constant`` nodes
(paddle2onnx), opset 11/12 (per-channel Q/DQ needs 13). :func:`prepare` fixes each input's shape, folds
``--const`` inputs into the graph, upgrades the opset, and lets onnxslim fold constants (which also
inlines an ``If`` whose condition became constant). The prepared file is what every target converts and
what the float reference (onnxruntime) runs.

:func:`to_torch` is the bridge to the targets whose converters read torch (android via litert-torch,
ios via coremltools, fpga via hls4ml's torch front end): onnx2torch rebuilds the graph as a torch.fx
module, edgekit adds the ONNX ops it lacks (LSTM), checks the module against onnxruntime on real inputs,
and exports it with ``torch.export``. Why this bridge (and not onnx2tf or onnx-tf) is measured in
docs/zoo.md: it keeps one float reference (onnxruntime on the prepared graph), needs no second
TensorFlow, and reuses every torch path edgekit already verifies.

onnx2torch imports torchvision for its NMS and RoiAlign converters only; the torchvision wheel on PyPI is
a CUDA build that fails to import beside CPU torch, so edgekit installs onnx2torch without dependencies
and, where torchvision is absent, gives onnx2torch a stand-in whose ops refuse with a one-line reason.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import InputSpecError, ModelLoadError, UnsupportedOpError

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
            consts: dict[str, np.ndarray]) -> Prepared:
    """The graph with every input static, ``consts`` folded in, opset >= 13 where it was lower, constants
    folded by onnxslim. Raises InputSpecError naming the input and the flag when a dimension is unknown."""
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
            if unknown and unknown != [0]:
                raise InputSpecError(
                    f"{path}: input {vi.name!r} has dynamic dimensions {_show(dims)}; give its size for this "
                    f"board: --input-shape {vi.name}:{','.join('1' if k == 0 and not isinstance(d, int) else str(d) if isinstance(d, int) else 'N' for k, d in enumerate(dims))}")
            shape = tuple(1 if not isinstance(d, int) else d for d in dims)  # dynamic batch: batch 1 on the edge
            if unknown:
                steps.append(f"input {vi.name}: dynamic first dimension {dims[0] or '?'} set to 1")
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
        divs = _div_by_constant_to_mul(proto)
        if divs:
            steps.append(f"{divs} Div by a constant rewritten as Mul by its reciprocal (int8 kernels: MUL, not DIV)")
        from edgekit.onnx_fuse import fold_affine_into_conv

        folded = fold_affine_into_conv(proto)
        if folded:
            steps.append(f"{folded} Mul/Add by a per-channel constant folded into the Conv before it (exact; fewer "
                         "int8 rounding points)")
        selected = _if_to_where(proto)
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


def _div_by_constant_to_mul(proto) -> int:
    """``Div(x, c)`` with a float constant ``c`` (HardSwish as paddle2onnx writes it: ``x * clip(x + 3) / 6``)
    becomes ``Mul(x, 1 / c)``: the quantizers annotate MUL with int8 kernels, not DIV. Within 1 ulp."""
    from onnx import numpy_helper

    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    done = 0
    for n in graph.node:
        if n.op_type != "Div" or n.domain not in ("", "ai.onnx") or len(n.input) != 2 or n.input[1] not in inits:
            continue
        c = numpy_helper.to_array(inits[n.input[1]])
        if c.dtype.kind != "f" or not np.all(np.isfinite(c)) or np.any(c == 0):
            continue
        name = f"{n.input[1]}/reciprocal_{done}"
        graph.initializer.append(numpy_helper.from_array((1.0 / c).astype(c.dtype), name))
        n.op_type = "Mul"
        n.input[1] = name
        done += 1
    return done


def _if_to_where(proto) -> list[str]:
    """Rewrite each top-level ``If`` whose branches have no side effects into both branches inlined and a
    ``Where`` per output. Exact where the branches' outputs broadcast to one shape; onnxruntime checks it."""
    from onnx import helper

    graph = proto.graph
    done: list[str] = []
    new_nodes = []
    for k, node in enumerate(graph.node):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            new_nodes.append(node)
            continue
        branches = {a.name: a.g for a in node.attribute}
        name = node.name or f"If_{k}"
        outs = []
        for key in ("then_branch", "else_branch"):
            g = branches[key]
            local = {o for n in g.node for o in n.output} | {i.name for i in g.initializer}
            prefix = f"{name}/{key}/"

            def ren(v, local=local, prefix=prefix):
                return prefix + v if v in local else v

            for init in g.initializer:
                t = type(init)()
                t.CopyFrom(init)
                t.name = ren(init.name)
                graph.initializer.append(t)
            for n in g.node:
                m = type(n)()
                m.CopyFrom(n)
                del m.input[:]
                m.input.extend(ren(v) if v else v for v in n.input)
                del m.output[:]
                m.output.extend(ren(v) for v in n.output)
                m.name = prefix + (n.name or n.op_type)
                new_nodes.append(m)
            outs.append([ren(o.name) for o in g.output])
        for j, out in enumerate(node.output):
            new_nodes.append(helper.make_node("Where", [node.input[0], outs[0][j], outs[1][j]], [out],
                                              name=f"{name}/select_{j}"))
        done.append(name)
    if done:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return done


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


# ---------------------------------------------------------------- ONNX -> torch


def _stub_torchvision() -> bool:
    """onnx2torch imports torchvision (for NMS / RoiAlign only). Where it is absent, a stand-in whose ops refuse
    (True: the stand-in was put in place)."""
    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # absent, or the PyPI CUDA build failing beside CPU torch
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]

    def refuse(*_a, **_k):
        raise UnsupportedOpError("the model uses NonMaxSuppression / RoiAlign, which edgekit's ONNX -> torch bridge "
                                 "runs with torchvision (not installed); convert it for --target jetson, or cut the "
                                 "post-processing off the graph")

    tv = types.ModuleType("torchvision")
    tv.ops = types.ModuleType("torchvision.ops")  # type: ignore[attr-defined]
    tv.ops.nms = tv.ops.roi_align = tv.ops.box_convert = refuse  # type: ignore[attr-defined]
    tv.__edgekit_stand_in__ = True  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv
    sys.modules["torchvision.ops"] = tv.ops  # type: ignore[attr-defined]
    return True


_REGISTERED = False


def _register_extra_converters() -> None:
    """ONNX ops onnx2torch 1.5 lacks and real edge models use."""
    global _REGISTERED
    if _REGISTERED:
        return
    torch = require("torch")
    from onnx2torch.node_converters.registry import add_converter
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult

    class OnnxLSTM(torch.nn.Module):
        """ONNX LSTM (layout 0, forward / bidirectional, default activations) as torch.nn.LSTM."""

        def __init__(self, lstm, num_dir: int, has_h: bool, has_c: bool):
            super().__init__()
            self.lstm, self.num_dir, self.has_h, self.has_c = lstm, num_dir, has_h, has_c

        def forward(self, x, *state):
            k = 0
            h0 = c0 = None
            if self.has_h:
                h0, k = state[k], k + 1
            if self.has_c:
                c0 = state[k]
            batch = x.shape[1]
            zeros = x.new_zeros(self.num_dir, batch, self.lstm.hidden_size)
            y, (h, c) = self.lstm(x, (zeros if h0 is None else h0, zeros if c0 is None else c0))
            seq = y.shape[0]
            y = y.reshape(seq, batch, self.num_dir, self.lstm.hidden_size).permute(0, 2, 1, 3)  # [S, D, B, H]
            return y, h, c

    def convert_lstm(node, graph):
        a = node.attributes
        ins = list(node.input_values) + [""] * (8 - len(node.input_values))
        x, w, r, b, seq_lens, h0, c0, p = ins[:8]
        if a.get("layout", 0) != 0 or a.get("input_forget", 0) or p or a.get("clip") is not None:
            raise UnsupportedOpError(f"LSTM node {node.name!r}: layout=1, input_forget, clip or peepholes are not "
                                     "bridged to torch (torch.nn.LSTM has none of them); convert for --target jetson")
        acts = [s.decode() if isinstance(s, bytes) else s for s in a.get("activations", [])]
        if acts and [v.lower() for v in acts] != ["sigmoid", "tanh", "tanh"] * (len(acts) // 3):
            raise UnsupportedOpError(f"LSTM node {node.name!r}: activations {acts} differ from torch.nn.LSTM's")
        if seq_lens and seq_lens in graph.initializers:
            seq_lens = ""  # taken as full length (exporters write the sequence length here); a shorter constant
            # would differ from onnxruntime, and bridge_model's check against onnxruntime refuses that
        if seq_lens or w not in graph.initializers or r not in graph.initializers:
            raise UnsupportedOpError(f"LSTM node {node.name!r}: sequence_lens or non-constant weights are not bridged")
        W = graph.initializers[w].to_numpy()
        R = graph.initializers[r].to_numpy()
        D, four_h, n_in = W.shape
        hidden = four_h // 4
        B = graph.initializers[b].to_numpy() if b else np.zeros((D, 8 * hidden), W.dtype)
        direction = a.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction == "reverse":
            raise UnsupportedOpError(f"LSTM node {node.name!r}: a reverse-only LSTM is not bridged")
        lstm = torch.nn.LSTM(n_in, hidden, num_layers=1, bidirectional=D == 2)

        def reorder(m):  # ONNX gates i, o, f, c -> torch i, f, g(c), o
            i, o, f, c = np.split(m, 4, axis=0)
            return torch.from_numpy(np.ascontiguousarray(np.concatenate([i, f, c, o], axis=0)))

        with torch.no_grad():
            for d in range(D):
                sfx = "_reverse" if d == 1 else ""
                getattr(lstm, f"weight_ih_l0{sfx}").copy_(reorder(W[d]))
                getattr(lstm, f"weight_hh_l0{sfx}").copy_(reorder(R[d]))
                getattr(lstm, f"bias_ih_l0{sfx}").copy_(reorder(B[d, :four_h]))
                getattr(lstm, f"bias_hh_l0{sfx}").copy_(reorder(B[d, four_h:]))
        outs = list(node.output_values) + [""] * (3 - len(node.output_values))
        module = OnnxLSTM(lstm, D, bool(h0), bool(c0))
        mapping = OnnxMapping(inputs=tuple(v for v in (x, h0, c0) if v), outputs=tuple(outs[:3]))
        return OperationConverterResult(torch_module=module, onnx_mapping=mapping)

    for v in (7, 14):
        add_converter(operation_type="LSTM", version=v)(convert_lstm)

    class StaticReshape(torch.nn.Module):
        """Reshape to a shape known when converting (onnx2torch's reads the shape tensor at run time, which
        torch.export cannot trace: a data-dependent guard)."""

        def __init__(self, shape: tuple[int, ...], allowzero: bool = False):
            super().__init__()
            self.shape, self.allowzero = shape, allowzero

        def forward(self, x):
            if self.allowzero:  # 0 is a zero-size dimension, not "copy the input's"
                return torch.reshape(x, list(self.shape))
            return torch.reshape(x, [x.shape[i] if d == 0 else d for i, d in enumerate(self.shape)])

    from onnx2torch.node_converters import registry

    def static_first(op: str, make):
        for desc, original in list(registry._CONVERTER_REGISTRY.items()):
            if desc.operation_type == op and desc.domain in ("", "ai.onnx"):
                def conv(node, graph, original=original):
                    return make(node, graph) or original(node, graph)
                registry._CONVERTER_REGISTRY[desc] = conv

    def reshape(node, graph):
        shape = node.input_values[1] if len(node.input_values) > 1 else ""
        if shape in graph.initializers:
            dims = tuple(int(d) for d in graph.initializers[shape].to_numpy().reshape(-1))
            allowzero = bool(node.attributes.get("allowzero", 0))  # torch.onnx's exporter writes allowzero=1
            return OperationConverterResult(torch_module=StaticReshape(dims, allowzero),
                                            onnx_mapping=OnnxMapping(inputs=(node.input_values[0],),
                                                                     outputs=tuple(node.output_values)))
        return None

    static_first("Reshape", reshape)
    for op, make in _static_converters(torch, OnnxMapping, OperationConverterResult).items():
        static_first(op, make)
    _REGISTERED = True


def _static_converters(torch, OnnxMapping, OperationConverterResult) -> dict:
    """Converters for ops whose parameters (starts, axes, pads, sizes ...) are constants once the graph is
    folded at fixed shapes: the torch module holds them as Python numbers. onnx2torch reads them from tensors
    at run time (``.numpy()``, ``.item()``), which torch.export cannot trace. Each returns None where a
    parameter is not constant or an attribute is outside what it covers, and onnx2torch's own converter runs."""
    F = torch.nn.functional

    class Fn(torch.nn.Module):
        def __init__(self, fn, what: str):
            super().__init__()
            self.fn, self.what = fn, what

        def forward(self, x):
            return self.fn(x)

        def extra_repr(self) -> str:
            return self.what

    def const(graph, name):
        if not name:
            return None
        if name in graph.initializers:
            return graph.initializers[name].to_numpy()
        return False  # not constant

    def result(node, fn, what):
        return OperationConverterResult(torch_module=Fn(fn, what), onnx_mapping=OnnxMapping(
            inputs=(node.input_values[0],), outputs=tuple(node.output_values)))

    def params(node, graph, first=1):
        vals = [const(graph, n) for n in node.input_values[first:]]
        return None if any(v is False for v in vals) else vals

    def slice_(node, graph):
        p = params(node, graph)
        if p is None or len(p) < 2:
            return None
        starts, ends = [int(v) for v in p[0]], [int(v) for v in p[1]]
        axes = [int(v) for v in p[2]] if len(p) > 2 and p[2] is not None else list(range(len(starts)))
        steps = [int(v) for v in p[3]] if len(p) > 3 and p[3] is not None else [1] * len(starts)
        if any(st == 0 for st in steps):
            return None

        def fn(x):
            idx = [slice(None)] * x.dim()
            backward = []
            for a, b, e, st in zip(axes, starts, ends, steps, strict=True):
                n = x.shape[a]
                if st > 0:
                    b = max(0, min(n, b + n if b < 0 else b))
                    e = max(0, min(n, e + n if e < 0 else e))
                    idx[a] = slice(b, e, st)
                else:  # ONNX: start clamped to [0, n-1], end to [-1, n-1]
                    b = max(0, min(n - 1, b + n if b < 0 else b))
                    e = max(-1, min(n - 1, e + n if e < 0 else e))
                    backward.append((a % x.dim(), list(range(b, e, st))))
            if any(i != slice(None) for i in idx):  # a no-op slice would trace to aten.alias (Core ML has none)
                x = x[tuple(idx)]
            for a, rows in backward:
                x = torch.index_select(x, a, torch.tensor(rows, dtype=torch.long))
            return x

        return result(node, fn, f"Slice(starts={starts}, ends={ends}, axes={axes}, steps={steps})")

    def squeeze(node, graph):
        p = params(node, graph)
        if p is None:
            return None
        axes = node.attributes.get("axes") or (p[0].tolist() if p and p[0] is not None else None)
        if axes is None:
            return result(node, lambda x: torch.squeeze(x), "Squeeze()")
        axes = [int(a) for a in axes]
        return result(node, lambda x: torch.squeeze(x, [a % x.dim() for a in axes]), f"Squeeze({axes})")

    def unsqueeze(node, graph):
        p = params(node, graph)
        if p is None:
            return None
        axes = node.attributes.get("axes") or (p[0].tolist() if p and p[0] is not None else None)
        if axes is None:
            return None
        axes = [int(a) for a in axes]

        def fn(x):
            out_rank = x.dim() + len(axes)
            for a in sorted(a % out_rank for a in axes):
                x = torch.unsqueeze(x, a)
            return x

        return result(node, fn, f"Unsqueeze({axes})")

    def pad(node, graph):
        p = params(node, graph)
        mode = node.attributes.get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if p is None or not p or p[0] is None or len(p) > 2 and p[2] is not None:
            return None
        pads = [int(v) for v in p[0]]
        value = float(p[1].reshape(-1)[0]) if len(p) > 1 and p[1] is not None and p[1].size else 0.0
        rank = len(pads) // 2
        pairs = []
        for i in reversed(range(rank)):  # torch: last dimension first
            pairs += [pads[i], pads[i + rank]]
        while len(pairs) > 2 and pairs[-2:] == [0, 0]:
            pairs = pairs[:-2]
        tmode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}.get(mode)
        if tmode is None:
            return None
        if tmode == "constant":
            return result(node, lambda x: F.pad(x, pairs, mode="constant", value=value), f"Pad({pads})")
        if len(pairs) > 2 * (rank - 2) or rank < 3:
            return None  # torch pads only the spatial dimensions in reflect / replicate modes
        pairs += [0, 0] * (rank - 2 - len(pairs) // 2)
        return result(node, lambda x: F.pad(x, pairs, mode=tmode), f"Pad({pads}, {mode})")

    def resize(node, graph):
        p = params(node, graph)
        if p is None:
            return None
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in node.attributes.items()}
        mode = a.get("mode", "nearest")
        ctm = a.get("coordinate_transformation_mode", "half_pixel")
        scales = p[1] if len(p) > 1 and p[1] is not None and p[1].size else None
        sizes = p[2] if len(p) > 2 and p[2] is not None and p[2].size else None
        if mode == "nearest" and ctm == "asymmetric" and a.get("nearest_mode", "round_prefer_floor") == "floor":
            tmode, align = "nearest", None
        elif mode == "linear" and ctm in ("half_pixel", "pytorch_half_pixel"):
            tmode, align = "bilinear", False
        elif mode == "linear" and ctm == "align_corners":
            tmode, align = "bilinear", True
        else:
            return None

        def fn(x):
            if sizes is not None:
                size = [int(s) for s in sizes[2:]]
            else:
                size = [int(np.floor(x.shape[i + 2] * float(scales[i + 2]))) for i in range(x.dim() - 2)]
            if tmode == "bilinear" and x.dim() != 4:
                raise UnsupportedOpError("Resize (linear) of a tensor that is not 4-D is not bridged")
            return F.interpolate(x, size=size, mode=tmode, align_corners=align)

        return result(node, fn, f"Resize({mode}, {ctm})")

    def ints(node, graph):  # the op's second input as Python ints, or None where it is not a constant
        p = params(node, graph)
        return None if p is None or not p or p[0] is None else [int(v) for v in p[0]]

    def expand(node, graph):
        shape = ints(node, graph)
        if shape is None:
            return None
        return result(node, lambda x: x.expand(list(torch.broadcast_shapes(tuple(x.shape), tuple(shape)))),
                      f"Expand({shape})")

    def tile(node, graph):
        reps = ints(node, graph)
        return None if reps is None else result(node, lambda x: x.repeat(reps), f"Tile({reps})")

    class Clip(torch.nn.Module):
        def forward(self, x, lo=None, hi=None):
            if lo is not None:
                x = torch.maximum(x, lo)
            if hi is not None:
                x = torch.minimum(x, hi)
            return x

    def clip(node, graph):
        ins = list(node.input_values)
        if len(ins) < 2 or all(const(graph, n) is not False for n in ins[1:]):
            return None  # constant bounds: onnx2torch's own converter
        lo = ins[1] if len(ins) > 1 and ins[1] else None
        hi = ins[2] if len(ins) > 2 and ins[2] else None
        if hi is not None and lo is None:
            return None
        return OperationConverterResult(torch_module=Clip(), onnx_mapping=OnnxMapping(
            inputs=tuple(v for v in (ins[0], lo, hi) if v), outputs=tuple(node.output_values)))

    return {"Slice": slice_, "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Pad": pad, "Resize": resize,
            "Expand": expand, "Tile": tile, "Clip": clip}


def differs(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why a bridged model's output is not its source's on the same inputs (None: within 1e-4 of the output's
    scale): the check both bridges (onnx2torch here, tf2onnx in edgekit.tf_bridge) make before anything converts."""
    if got.shape != want.shape:
        return f"shape {got.shape}, not {want.shape}"
    diff = float(np.max(np.abs(np.asarray(got, np.float64) - want), initial=0.0))
    scale = float(np.max(np.abs(want), initial=0.0))
    return None if diff <= 1e-4 * max(1.0, scale) else f"max difference {diff:.4g}"


def bridge_model(model, source: str):
    """An ONNX :class:`~edgekit.ingest.Model` as a torch ExportedProgram Model (the onnx2torch bridge), for a
    converter that reads torch. The float reference stays onnxruntime on the prepared graph; the bridged
    module is checked against it on seeded inputs first, so a wrong translation is refused here."""
    import dataclasses

    torch = require("torch")
    onnx = require("onnx")
    prep = model.onnx_prep
    if prep is not None and prep.quantized_ops:
        qdq_only = set(prep.quantized_ops) <= {"QuantizeLinear", "DequantizeLinear"}
        raise UnsupportedOpError(
            f"{source}: the model is already quantized ({', '.join(prep.quantized_ops)}); this target's converter "
            "quantizes a float model itself: give the float ONNX model"
            + (" (or convert this one for --target jetson: TensorRT runs Q/DQ graphs)" if qdq_only else ""))
    proto = prep.proto if prep is not None else onnx.load(str(model.onnx_path))
    module = to_torch(proto, source).eval()
    feeds = model.seeded_feeds(1)
    example = tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs)
    from edgekit.quiet import quiet_loggers

    try:
        with torch.no_grad(), quiet_loggers("torch", "torch._export", "torch.export", "torch.fx"):
            got = module(*example)
            got = list(got) if isinstance(got, (list, tuple)) else [got]
            want = model.reference()(feeds)
            for o, a, b in zip(model.outputs, got, want, strict=True):
                why = differs(a.detach().numpy(), b)
                if why:
                    raise UnsupportedOpError(
                        f"{source}: the ONNX -> torch bridge (onnx2torch {onnx2torch_version()}) computes output "
                        f"{o.name!r} differently from onnxruntime ({why}); a limitation of the bridge: convert for "
                        "--target jetson")
            ep = torch.export.export(module, example)
    except UnsupportedOpError:
        raise
    except Exception as exc:  # torch.export raises many types on graphs it cannot trace
        raise UnsupportedOpError(
            f"{source}: torch.export cannot trace the bridged model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}); a limitation of the ONNX -> torch bridge: convert for "
            "--target jetson") from None
    return dataclasses.replace(model, kind="exported_program", torch_module=ep.module(), exported=ep,
                               bridge=f"onnx2torch {onnx2torch_version()}")


def onnx2torch_version() -> str | None:
    from edgekit.deps import version

    return version("onnx2torch")


def to_torch(proto, source: str):
    """The prepared ONNX graph as a torch.fx module (onnx2torch plus edgekit's extra converters).
    Raises UnsupportedOpError naming the op onnx2torch cannot translate."""
    require("torch")
    stubbed = "onnx2torch" not in sys.modules and _stub_torchvision()
    try:
        import onnx2torch
    except ImportError:
        from edgekit.errors import MissingToolchainError

        raise MissingToolchainError(
            "onnx2torch is needed to take an ONNX model to this target but is not installed; "
            "pip install --no-deps onnx2torch==1.5.15 (its torchvision requirement would pull a CUDA build)"
        ) from None
    finally:
        if stubbed:  # the stand-in only while onnx2torch imports: torch.onnx looks torchvision up by spec
            for k in ("torchvision", "torchvision.ops"):
                sys.modules.pop(k, None)
    _register_extra_converters()
    try:
        return onnx2torch.convert(proto)
    except UnsupportedOpError:
        raise
    except NotImplementedError as exc:
        msg = str(exc)
        import re

        m = re.search(r"operation_type='(\w+)', version=(\d+)", msg)
        what = (f"ONNX op {m.group(1)} (opset {m.group(2)}) has no torch translation" if m else
                f"a node cannot be translated ({msg.splitlines()[0][:160]})")
        raise UnsupportedOpError(
            f"{source}: {what} in onnx2torch {onnx2torch_version()}, the bridge edgekit uses for this target (a "
            "limitation of the bridge, not of the target); convert for --target jetson, or replace that op in the "
            "model") from None
    except Exception as exc:  # onnx2torch raises KeyError / AttributeError on graphs it cannot read
        raise ModelLoadError(
            f"{source}: the ONNX -> torch bridge (onnx2torch {onnx2torch_version()}) failed "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
            "a limitation of the bridge: convert for --target jetson") from None
