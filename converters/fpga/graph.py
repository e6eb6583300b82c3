"""Graph-mode quantization for the fabric: the whole float graph (branches, residual adds, concats, depthwise
convolutions, BatchNorm, pooling) quantized with brevitas' graph-mode quantizer and power-of-two scales.

1. ``to_torch``: the float ONNX (onnxslim-cleaned) goes to torch.fx through onnx2torch (the bridge the android and
   ios targets use); ``standardize`` rewrites onnx2torch's modules into the torch modules and functions brevitas'
   graph quantizer knows: a two-tensor Add/Sub into ``operator.add``/``sub``, Concat into ``torch.cat``, Clip into
   ReLU6 / Hardtanh, a Mul/Div/Add/Sub by a per-channel constant into an affine layer that BatchNorm folding merges
   into the conv before it, and average pooling (global or not) into a depthwise convolution with constant
   weights 1/k (hls4ml's ONNX front end takes pooling only in its channels-last form, which qonnx does not write for
   AveragePool). Anything hls4ml cannot build is refused here, naming the op.
2. ``quantize``: ``brevitas.graph.quantize.preprocess_for_quantize`` (BatchNorm merged into the conv before it) and
   ``quantize`` with the maps of brevitas' FlexML target (Xilinx's power-of-two scheme): ``FixedPoint`` weight and
   activation quantizers, ``Int32Bias`` (FlexML's ``Int16Bias`` overflows: a conv that absorbed HardSigmoid's
   +0.5 lost it, bias scale 2^-17), residual adds and concats whose inputs share one quantizer (one scale, so
   hls4ml's fixed-point add is exact), each at ``bits``; the input quantizer stays 8-bit (the DMA word) and is
   unsigned for non-negative data. A BatchNorm that follows no conv becomes a depthwise 1x1 convolution.
3. calibration and QONNX export are ``quant.calibrate`` / ``quant.export_qonnx`` (unchanged for both paths).

Chosen over rebuilding the model layer by layer with brevitas layers (which takes chains only) because brevitas'
graph quantizer already solves scale alignment across branches; chosen over onnxruntime's QDQ quantizer plus
qonnx's QCDQ->Quant conversion because that quantizer has no power-of-two scales (rounding its scales afterwards
moves every zero point and bias).
"""

from __future__ import annotations

import operator
import re
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import UnsupportedOpError

# onnx2torch modules that are already torch modules brevitas knows, kept as they are
KEEP = ("Conv1d", "Conv2d", "Linear", "ReLU", "ReLU6", "Hardtanh", "MaxPool1d", "MaxPool2d", "Flatten",
        "BatchNorm1d", "BatchNorm2d", "LeakyReLU")
# activations hls4ml computes from lookup tables: not bit-exact against the exact function, so only at the output
TABLE_OPS = {"Sigmoid": "sigmoid", "Softmax": "softmax", "OnnxSoftmaxV1V11": "softmax", "Tanh": "tanh"}


def _clean(name: str) -> str:
    return re.sub(r"\W", "_", name).strip("_") or "layer"


def to_torch(proto, source: str):
    """The float ONNX graph as a torch.fx GraphModule (onnx2torch), after ``prepare``."""
    from edgekit.onnx_bridge import to_torch as bridge

    g = proto.graph
    if len(g.input) != 1 or len(g.output) != 1:
        raise UnsupportedOpError("the FPGA target takes models with one input and one output (hls4ml's ONNX front "
                                 f"end); this one has {len(g.input)} inputs and {len(g.output)} outputs")
    prepare(proto)
    return bridge(proto, source)


def strip_input_transpose(proto) -> tuple[int, ...] | None:
    """A channels-last model (Keras, TensorFlow: NHWC input, then a Transpose to NCHW) without that Transpose: the
    fabric streams channels-last anyway, and hls4ml streams no Transpose. Returns the permutation the caller applies
    to the data it gives the stripped graph (None where there was no such Transpose)."""
    from onnx import helper

    g = proto.graph
    name = g.input[0].name
    readers = [n for n in g.node if name in n.input]
    if len(readers) != 1:
        return None
    t = readers[0]
    dims = list(g.input[0].type.tensor_type.shape.dim)
    if t.op_type == "Reshape" and len(dims) in (3, 4) and dims[-1].dim_value == 1:
        # tf2onnx writes the NHWC -> NCHW transpose of a one-channel input as a Reshape
        from onnx import numpy_helper

        shape = next((numpy_helper.to_array(i).tolist() for i in g.initializer if i.name == t.input[1]), None)
        perm = (0, 3, 1, 2) if len(dims) == 4 else (0, 2, 1)
        if shape is None or [int(v) for v in shape][1:] != [dims[i].dim_value for i in perm][1:]:
            return None
    elif t.op_type == "Transpose":
        perm = tuple(next((list(a.ints) for a in t.attribute if a.name == "perm"), []))
        if perm not in ((0, 3, 1, 2), (0, 2, 1)) or len(dims) != len(perm):
            return None
    else:
        return None
    new = [dims[i] for i in perm]
    vi = helper.make_tensor_value_info(name, g.input[0].type.tensor_type.elem_type,
                                       [d.dim_value if d.HasField("dim_value") else d.dim_param for d in new])
    g.input.remove(g.input[0])
    g.input.insert(0, vi)
    for n in g.node:
        for i, x in enumerate(n.input):
            if x == t.output[0]:
                n.input[i] = name
    g.node.remove(t)
    return perm


def prepare(proto) -> None:
    """ONNX rewrites before the bridge: a ReduceMean over the spatial axes (PyTorch's ``x.mean((2, 3))``, Keras'
    GlobalAveragePooling) is a GlobalAveragePool (+ Flatten where the axes are not kept)."""
    import onnx
    from onnx import helper, numpy_helper

    inferred = onnx.shape_inference.infer_shapes(proto)
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in list(inferred.graph.value_info)
            + list(inferred.graph.input) + list(inferred.graph.output) if v.type.tensor_type.HasField("shape")}
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    nodes = []
    for n in proto.graph.node:
        r = rank.get(n.input[0]) if n.input else None
        if n.op_type != "ReduceMean" or r not in (3, 4):
            nodes.append(n)
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        axes = a.get("axes")
        if axes is None and len(n.input) > 1:
            axes = (inits.get(n.input[1]) if n.input[1] in inits else consts.get(n.input[1]))
        if axes is None or sorted(int(x) % r for x in np.asarray(axes).reshape(-1)) != list(range(2, r)):
            nodes.append(n)  # not a global pool: refused later by name
            continue
        if a.get("keepdims", 1):
            nodes.append(helper.make_node("GlobalAveragePool", [n.input[0]], list(n.output), name=n.name))
        else:
            mid = n.output[0] + "_pooled"
            nodes.append(helper.make_node("GlobalAveragePool", [n.input[0]], [mid], name=n.name))
            nodes.append(helper.make_node("Flatten", [mid], list(n.output), name=n.name + "_flatten", axis=1))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)


def standardize(gm, proto, example: np.ndarray, missing_ops: dict[str, str] | None = None):
    """``missing_ops``: the target profile's ONNX op -> why hls4ml cannot build it (``targets/fpga.toml``).
``gm`` (onnx2torch) rewritten into torch modules and functions brevitas' graph quantizer maps; the layer
    list (name, kind) for the manifest. Refuses an op hls4ml cannot build, naming it."""
    torch = require("torch")
    from torch import fx, nn
    from torch.fx.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(torch.from_numpy(np.ascontiguousarray(example[:1], dtype=np.float32)))
    shapes = {n.name: list(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
              if "tensor_meta" in n.meta and hasattr(n.meta["tensor_meta"], "shape")}
    op_of = {n.name.lstrip("/"): n.op_type for n in proto.graph.node}
    op_of.update({_clean(n.name): n.op_type for n in proto.graph.node})

    root = nn.Module()
    graph = fx.Graph()
    env: dict[str, Any] = {}
    consts: dict[str, np.ndarray] = {}
    layers: list[dict[str, str]] = []
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    last_data = out_node.args[0]
    last_data = last_data[0] if isinstance(last_data, (tuple, list)) else last_data

    def add(name: str, mod, args, kind: str):
        name = _clean(name)
        while hasattr(root, name):
            name += "_"
        setattr(root, name, mod)
        layers.append({"name": name, "kind": kind})
        return graph.call_module(name, tuple(args))

    def affine(name: str, data, const: np.ndarray, mode: str, shape: list[int], shift: float = 0.0):
        """x (op) const for a scalar or per-channel const: a BatchNorm in eval form (merged into the conv before it
        by brevitas, or a depthwise 1x1 conv where no conv precedes)."""
        c = np.asarray(const, np.float32)
        chans = shape[1] if len(shape) > 1 else 1
        flat = np.full(chans, float(c.reshape(-1)[0]), np.float32) if c.size == 1 else c.reshape(-1)
        ok = len(shape) in (2, 3, 4) and flat.size == chans
        if ok and c.size > 1:
            ref = flat.reshape([1, chans] + [1] * (len(shape) - 2))
            try:
                ok = np.array_equal(np.broadcast_to(c, shape), np.broadcast_to(ref, shape))
            except ValueError:
                ok = False
        if not ok:
            raise UnsupportedOpError(
                f"{op_of.get(name, name)} {name}: a {mode} by a constant of shape {list(c.shape)} on a tensor of "
                f"shape {shape}; the fabric takes scalars and per-channel constants (folded into the layer before)")
        bn = (nn.BatchNorm1d if len(shape) in (2, 3) else nn.BatchNorm2d)(chans, eps=0.0)
        bn.eval()
        bn.edgekit_rank = len(shape)
        with torch.no_grad():
            bn.running_mean.zero_()
            bn.running_var.fill_(1.0)
            w, b = np.ones(chans, np.float32), np.zeros(chans, np.float32)
            if mode == "Mul":
                w, b = flat, np.full(chans, shift, np.float32)
            elif mode == "Div":
                w = 1.0 / flat
            elif mode == "Add":
                b = flat
            else:  # Sub
                b = -flat
            bn.weight.copy_(torch.from_numpy(w))
            bn.bias.copy_(torch.from_numpy(b))
        return add(name, bn, [data], f"{mode} by a constant (folded)")

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = graph.placeholder("x")
            continue
        if node.op == "get_attr":
            obj = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            consts[node.name] = obj.detach().cpu().numpy() if hasattr(obj, "detach") else np.asarray(obj)
            continue
        if node.op == "output":
            graph.output(fx.map_arg(node.args[0], lambda a: env[a.name]))
            continue
        if node.op != "call_module":
            raise UnsupportedOpError(f"node {node.name} ({node.op} {node.target}) cannot be read for the fabric")
        mod = gm.get_submodule(node.target)
        cls = type(mod).__name__
        onnx_op = op_of.get(str(node.target), op_of.get(_clean(str(node.target)), cls))
        data = [a for a in node.args if isinstance(a, fx.Node) and a.name not in consts]
        cargs = [consts[a.name] for a in node.args if isinstance(a, fx.Node) and a.name in consts]
        ins = [env[a.name] for a in data]
        in_shape = shapes.get(data[0].name, []) if data else []
        if cls in ("OnnxCopyIdentity", "Identity", "Dropout", "OnnxDropoutDynamic"):
            env[node.name] = ins[0]
        elif cls in ("StaticReshape", "OnnxReshape", "OnnxFlatten", "Flatten", "OnnxSqueezeStaticAxes",
                     "OnnxUnsqueezeStaticAxes"):
            out = shapes.get(node.name)
            if out is None or not in_shape or out[0] != in_shape[0]:
                raise UnsupportedOpError(f"{onnx_op} {node.target}: a reshape that moves the batch axis ({in_shape} "
                                         f"-> {out}); the fabric takes reshapes of one sample")
            # x.flatten(1) / x.reshape(-1, ...): methods brevitas sees a quantized tensor pass through unchanged
            if len(out) == 2:
                env[node.name] = graph.call_method("flatten", (ins[0], 1))
            else:
                env[node.name] = graph.call_method("reshape", (ins[0], -1, *out[1:]))
            layers.append({"name": _clean(str(node.target)), "kind": "flatten" if len(out) == 2 else "reshape"})
        elif (cls == "Sequential" and len(mod) == 2 and type(mod[0]).__name__ == "OnnxPadStatic"
              and type(mod[1]).__name__ in ("Conv1d", "Conv2d")):
            # measured: hls4ml 1.3's streamed conv with one-sided padding is not bit-exact against QONNX
            raise UnsupportedOpError(
                f"Conv {node.target} padded on one side only ({list(mod[0].pads)}, TensorFlow's SAME at a stride or "
                "an even kernel): hls4ml's streamed convolution does not compute it as QONNX does (not bit-exact, "
                "measured), so the fabric path refuses it; pad symmetrically (or with a Pad layer hls4ml reads) "
                "and export again")
        elif cls in KEEP:
            if cls.startswith("MaxPool") and (any(np.atleast_1d(mod.padding)) or mod.ceil_mode):
                raise UnsupportedOpError(
                    f"MaxPool {node.target} with padding {mod.padding}{' and ceil_mode' if mod.ceil_mode else ''}: "
                    "hls4ml's streamed pooling (io_stream, how the fabric runs CNNs) takes no padding")
            if cls in ("Conv1d", "Conv2d") and mod.padding_mode != "zeros":
                raise UnsupportedOpError(f"Conv {node.target}: padding mode {mod.padding_mode!r}; hls4ml pads "
                                         "with zeros only")
            kind = {"Conv1d": "conv", "Conv2d": "conv", "Linear": "linear"}.get(cls, cls.lower())
            if kind == "conv" and mod.groups > 1:
                kind = "depthwise conv" if mod.groups == mod.in_channels == mod.out_channels else "grouped conv"
                if kind == "grouped conv":
                    raise UnsupportedOpError(f"Conv {node.target}: groups={mod.groups} with {mod.in_channels} "
                                             "input channels; hls4ml has depthwise (groups = channels) and "
                                             "ordinary convolutions, no grouped ones")
            if kind.startswith("batchnorm"):
                mod.edgekit_rank = len(in_shape)
            env[node.name] = add(str(node.target), mod, ins, kind)
        elif cls == "OnnxClip":
            lo, hi = mod.min_val, mod.max_val
            if lo is None or hi is None or float(lo) > 0.0:
                raise UnsupportedOpError(f"Clip {node.target} to [{lo}, {hi}]: the fabric takes Clip as a bounded "
                                         "ReLU (min 0) or a Hardtanh (min < 0 < max)")
            m = nn.ReLU6() if (float(lo), float(hi)) == (0.0, 6.0) else clip_module(float(lo), float(hi))
            env[node.name] = add(str(node.target), m, ins, "clip")
        elif cls in ("OnnxHardSigmoid", "Hardsigmoid", "Hardswish"):
            # clip(alpha x + beta, 0, 1): an affine layer (merged into the conv before it) and a Hardtanh(0, 1);
            # HardSwish is x times that (hls4ml's Multiply merge of two tensors of one shape)
            alpha, beta = (float(mod.alpha), float(mod.beta)) if cls == "OnnxHardSigmoid" else (1 / 6, 0.5)
            scaled = affine(str(node.target), ins[0], np.float32(alpha), "Mul", in_shape, shift=beta)
            gate = add(str(node.target) + "_clip", clip_module(0.0, 1.0), [scaled], "hard sigmoid (clip 0..1)")
            if cls == "Hardswish":
                env[node.name] = graph.call_function(operator.mul, (ins[0], gate))
                layers.append({"name": node.name, "kind": "mul (two tensors)"})
            else:
                env[node.name] = gate
        elif cls == "OnnxBinaryMathOperation":
            fn = {torch.add: "Add", torch.sub: "Sub", torch.mul: "Mul", torch.div: "Div"}.get(mod.math_op_function)
            if fn is None:
                raise UnsupportedOpError(f"{onnx_op} {node.target}: hls4ml has no such element-wise op")
            if len(data) == 2:
                a, b = (shapes.get(d.name) for d in data)
                if a is not None and b is not None and list(a) != list(b):
                    raise UnsupportedOpError(
                        f"{onnx_op} {node.target} of a {a} tensor by a {b} tensor: hls4ml's {fn} merge layer takes two "
                        "tensors of one shape (no broadcasting; a squeeze-excitation scale is such a broadcast)")
                if fn == "Div":
                    raise UnsupportedOpError(f"Div {node.target} of two tensors: hls4ml's Divide merge is not "
                                             "bit-exact (a fixed-point reciprocal)")
                env[node.name] = graph.call_function({"Add": operator.add, "Sub": operator.sub,
                                                      "Mul": operator.mul}[fn], tuple(ins))
                layers.append({"name": node.name, "kind": f"{fn.lower()} (two tensors)"})
            else:
                env[node.name] = affine(str(node.target), ins[0], cargs[0], fn, in_shape)
        elif cls == "OnnxConcat":
            env[node.name] = graph.call_function(torch.cat, (tuple(ins),), {"dim": int(mod.axis)})
            layers.append({"name": node.name, "kind": "concat"})
        elif cls in ("AvgPool1d", "AvgPool2d") or cls.startswith("OnnxGlobalAveragePool"):
            nd = len(in_shape) - 2
            if nd not in (1, 2):
                raise UnsupportedOpError(f"{onnx_op} {node.target} on a {len(in_shape)}-D tensor: the fabric pools "
                                         "1-D and 2-D feature maps")
            chans = in_shape[1]
            if cls.startswith("OnnxGlobal"):
                k, s, p = tuple(in_shape[2:]), 1, 0
            else:
                k = tuple(np.broadcast_to(mod.kernel_size, (nd,)).tolist())
                s = tuple(np.broadcast_to(mod.stride, (nd,)).tolist())
                p = tuple(np.broadcast_to(mod.padding, (nd,)).tolist())
                if any(p) and not mod.count_include_pad or mod.ceil_mode:
                    raise UnsupportedOpError(f"AveragePool {node.target}: padding without count_include_pad, or "
                                             "ceil_mode; hls4ml's pooling averages over whole windows")
            conv = (nn.Conv1d if nd == 1 else nn.Conv2d)(chans, chans, k, stride=s, padding=p, groups=chans,
                                                        bias=False)
            with torch.no_grad():
                conv.weight.fill_(1.0 / float(np.prod(k)))
            env[node.name] = add(str(node.target), conv, ins, "average pool (depthwise conv, weights 1/k)")
        elif cls in TABLE_OPS or onnx_op in ("Sigmoid", "Softmax", "Tanh"):
            kind = TABLE_OPS.get(cls, onnx_op.lower())
            if node is not last_data:
                raise UnsupportedOpError(
                    f"{onnx_op} {node.target} inside the network: hls4ml computes {onnx_op} from a lookup table, "
                    "which cannot be bit-exact against the exact function; the fabric takes it only as the output "
                    "layer (after the logits)")
            if kind == "softmax" and getattr(mod, "axis", getattr(mod, "dim", -1)) not in (-1, 1, None):
                raise UnsupportedOpError(f"Softmax {node.target}: axis {mod.axis}; hls4ml's softmax runs over the "
                                         "features of a [batch, features] tensor")
            if kind == "tanh":
                raise UnsupportedOpError(f"Tanh {node.target} at the output: hls4ml has a tanh table, but edgekit's "
                                         "check of its resolution covers sigmoid and softmax only; end the model "
                                         "with its logits")
            table = nn.Sigmoid() if kind == "sigmoid" else nn.Softmax(dim=-1)  # TableActivation after quantizing
            env[node.name] = add(str(node.target), table, ins, kind)
        else:
            what = (missing_ops or {}).get(onnx_op)
            if onnx_op == "Transpose":
                raise UnsupportedOpError(
                    f"Transpose {node.target} inside the network: hls4ml has a Transpose layer (io_parallel only), "
                    "but edgekit's fabric path streams CNNs (io_stream); only a channels-last model's input "
                    "transpose is taken (done on the host): a limitation of edgekit's converter, not of the target")
            if onnx_op == "MaxPool":  # onnx2torch's module for asymmetric pads (TensorFlow's SAME)
                raise UnsupportedOpError(f"MaxPool {node.target} with asymmetric padding: hls4ml's streamed pooling "
                                         "(io_stream, how the fabric runs CNNs) takes no padding")
            if what:
                raise UnsupportedOpError(f"{onnx_op} {node.target}: {what}; the FPGA target cannot build it (run it "
                                         "on the host before the fabric, or replace it)")
            raise UnsupportedOpError(
                f"{onnx_op} {node.target}: not mapped onto the fabric by edgekit (the quantized graph would not pass "
                "hls4ml's QONNX front end); replace it, or convert for another target")
    gm2 = fx.GraphModule(root, graph)
    gm2.graph.lint()
    return gm2, layers


_CLIPS: dict[tuple[float, float], type] = {}


def clip_module(lo: float, hi: float):
    """A Hardtanh(lo, hi) of a class of its own per range: brevitas' graph quantizer maps a module by its type, and
    FlexML's Hardtanh entry reads the range through callables its activation handler never calls; each range gets
    a map entry with its bounds (``_maps``). Unsigned quantizer where the range starts at 0 (a hard sigmoid)."""
    from torch import nn

    cls = _CLIPS.get((lo, hi))
    if cls is None:
        # a torch.nn module for fx: a leaf, not traced into F.hardtanh
        cls = type(f"Hardtanh{len(_CLIPS)}", (nn.Hardtanh,), {"__module__": nn.Hardtanh.__module__})
        _CLIPS[(lo, hi)] = cls
    return cls(lo, hi)


def _maps(bits: int):
    """brevitas FlexML maps (power-of-two) at ``bits`` for weights and activations; sigmoid left to the tables."""
    from brevitas.graph.target import flexml
    from torch import nn

    from brevitas.quant.scaled_int import Int32Bias

    def at(entry):
        cls, kw = entry
        kw = dict(kw)
        for k in list(kw):
            if k == "weight_quant":
                kw["weight_bit_width"] = bits
            if k == "bias_quant":  # Int16Bias overflows where the bias is large beside input x weight scale
                kw[k] = Int32Bias
            if k == "act_quant":
                kw["bit_width"] = bits
        return cls, kw

    compute = {k: (at(v) if v is not None else None) for k, v in flexml.FLEXML_COMPUTE_LAYER_MAP.items()
               if k not in (nn.AvgPool2d, nn.MultiheadAttention, nn.BatchNorm1d, nn.BatchNorm2d)}
    acts = {k: at(v) for k, v in flexml.FLEXML_QUANT_ACT_MAP.items() if k in (nn.ReLU, nn.ReLU6)}
    from brevitas.nn import QuantHardTanh
    from brevitas.quant.fixed_point import Int8ActPerTensorFixedPointMinMaxInit, Uint8ActPerTensorFixedPointMaxInit

    for (lo, hi), cls in _CLIPS.items():
        acts[cls] = (QuantHardTanh, {"act_quant": Uint8ActPerTensorFixedPointMaxInit if lo == 0.0 else
                                     Int8ActPerTensorFixedPointMinMaxInit, "min_val": lo, "max_val": hi,
                                     "bit_width": bits, "return_quant_tensor": True})
    ident = {k: at(v) for k, v in flexml.FLEXML_QUANT_IDENTITY_MAP.items()}
    return compute, acts, ident


def quantize(gm, bits: int, signed_input: bool):
    """brevitas graph-mode quantization of the standardized graph: BatchNorm merged, power-of-two scales, shared
    quantizers on the inputs of adds and concats; the input quantizer 8-bit, unsigned for non-negative data."""
    qnn = require("brevitas.nn", "fpga")
    from brevitas.graph.quantize import preprocess_for_quantize
    from brevitas.graph.quantize import quantize as bquantize
    from brevitas.quant import Int8ActPerTensorFixedPoint, Uint8ActPerTensorFixedPoint
    from edgekit.converters.fpga.quant import TableActivation
    from torch import nn

    # a BatchNorm reading a tensor that also goes elsewhere (HardSwish's x * hardsigmoid(x)) must not be merged into
    # the conv before it: brevitas merges it regardless and changes the other reader's input (measured: error 0.11
    # of a range of 1.06 on a conv -> HardSwish); it stays a layer (a depthwise 1x1 conv)
    _bn_to_depthwise(gm, forked_only=True)
    # traced again by brevitas' tracer: its residual handler does not converge on the graph as built by hand
    gm = preprocess_for_quantize(gm, trace_model=True, relu6_to_relu=False)
    _bn_to_depthwise(gm)
    compute, acts, ident = _maps(bits)
    qm = bquantize(gm, quant_identity_map=ident, compute_layer_map=compute, quant_act_map=acts)
    first = next(n for n in qm.graph.nodes if n.op == "call_module")
    if not isinstance(qm.get_submodule(first.target), qnn.QuantIdentity):
        raise UnsupportedOpError("brevitas put no quantizer on the model's input; the fabric needs one")
    setattr(qm, first.target, qnn.QuantIdentity(
        act_quant=Int8ActPerTensorFixedPoint if signed_input else Uint8ActPerTensorFixedPoint, bit_width=8,
        return_quant_tensor=True))
    _drop_output_requant(qm)
    for node in qm.graph.nodes:  # the output's sigmoid / softmax: float in QONNX, hls4ml's lookup table
        if node.op == "call_module" and isinstance(qm.get_submodule(node.target), (nn.Sigmoid, nn.Softmax)):
            kind = "sigmoid" if isinstance(qm.get_submodule(node.target), nn.Sigmoid) else "softmax"
            parent, _, name = node.target.rpartition(".")
            setattr(qm.get_submodule(parent) if parent else qm, name, TableActivation(kind))
    qm.recompile()
    return qm.eval()


def _drop_output_requant(qm) -> None:
    """No requantization of the last layer's outputs (the logits, or the values a sigmoid / softmax table reads):
    they leave the fabric at the layer's exact accumulator precision (input scale x weight scale), as wide as
    hls4ml's accumulator, instead of being rounded to the activation bits."""
    qnn = require("brevitas.nn", "fpga")
    from torch import nn

    out = next(n for n in qm.graph.nodes if n.op == "output")
    node = out.args[0]
    if isinstance(node, (tuple, list)):
        return
    if node.op == "call_module" and isinstance(qm.get_submodule(node.target), (nn.Sigmoid, nn.Softmax)):
        node = node.args[0]
    if node.op != "call_module" or not isinstance(qm.get_submodule(node.target), qnn.QuantIdentity):
        return
    src = node.args[0]
    if src.op != "call_module" or not isinstance(qm.get_submodule(src.target), (qnn.QuantLinear, qnn.QuantConv2d,
                                                                                qnn.QuantConv1d)):
        return
    node.replace_all_uses_with(src)
    qm.graph.erase_node(node)
    qm.get_submodule(src.target).return_quant_tensor = False
    qm.recompile()


def _bn_to_depthwise(gm, forked_only: bool = False) -> None:
    """A BatchNorm left after merging (it follows no conv) as a depthwise 1x1 conv (2-D input: a diagonal linear)
    with the same scale and shift; ``forked_only``: only those whose input has other readers too."""
    torch = require("torch")
    from torch import nn

    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        if forked_only and not (node.args and len(node.args[0].users) > 1):
            continue
        bn = gm.get_submodule(node.target)
        if not isinstance(bn, (nn.BatchNorm1d, nn.BatchNorm2d)):
            continue
        scale = (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()
        shift = (bn.bias - bn.running_mean * scale).detach()
        c = scale.numel()
        rank = getattr(bn, "edgekit_rank", 4 if isinstance(bn, nn.BatchNorm2d) else 3)
        if isinstance(bn, nn.BatchNorm2d):
            m = nn.Conv2d(c, c, 1, groups=c)
        elif rank == 3:
            m = nn.Conv1d(c, c, 1, groups=c)
        else:
            m = nn.Linear(c, c)
        with torch.no_grad():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.diag(scale))
            else:
                m.weight.copy_(scale.reshape(c, 1, *([1] * (m.weight.ndim - 2))))
            m.bias.copy_(shift)
        parent, _, name = node.target.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, name, m)
    gm.recompile()


def qonnx_costs(mw, bits: int) -> list[Any]:
    """Per compute layer of the QONNX graph (Conv, MatMul): its weights and outputs, for the resource estimate."""
    from edgekit.fabric import FabricLayer

    producers = {o: n for n in mw.graph.node for o in n.output}
    out = []
    for n in mw.graph.node:
        if n.op_type not in ("Conv", "MatMul"):
            continue
        w = mw.get_initializer(n.input[1])
        wbits = bits
        q = producers.get(n.input[1])
        if w is None and q is not None and q.op_type == "Quant":
            w = mw.get_initializer(q.input[0])
            b = mw.get_initializer(q.input[3])
            wbits = int(np.asarray(b).reshape(-1)[0]) if b is not None else bits
        if w is None:
            continue
        w = np.asarray(w)
        outs = int(w.shape[0] if n.op_type == "Conv" else w.shape[-1])
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        kernel = int(w.size // w.shape[0]) if group > 1 else 0  # depthwise: one window of weights per channel
        a_bits = 8 if not out else bits
        shape = mw.get_tensor_shape(n.input[0]) or []
        pixels = int(np.prod(shape[1:-1])) if n.op_type == "Conv" and len(shape) >= 3 else 1  # channels-last
        out.append(FabricLayer(n.name, int(w.size), wbits, a_bits, outs, kernel, pixels))
    return out
