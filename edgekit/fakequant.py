"""Fake quantization in a torch fx graph: what the targets' INT8 does to a float model, made trainable.

A model's graph is rebuilt as a plain fx GraphModule (:func:`graph_module`), its eval-mode batch norms folded into
the convolutions before them (:func:`fold_batch_norms`, as the converters fold them), and fake-quant modules put
where the target quantizes (:func:`insert_fake_quant`): per-channel symmetric int8 weights of every convolution and
linear layer, per-tensor int8 activations (symmetric on jetson, asymmetric on android). Activation ranges are
observed once (mode ``observe``), then held (``quant``); a ``capture`` list on each activation point collects what
passes through it. The trainer (edgekit.finetune) and convert's reading of a student's ranges (edgekit.lineage)
build the same graph from these, so the points line up one to one.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import ModelLoadError
from edgekit.ingest import Model

# the targets whose INT8 the student models: per-channel symmetric int8 weights, per-tensor int8 activations,
# symmetric on jetson (TensorRT's Q/DQ), asymmetric on android (TFLite)
SYMMETRIC_ACTS = {"jetson": True, "android": False}
TARGETS = tuple(SYMMETRIC_ACTS)


def fq_modules():
    torch = require("torch")

    class ActFQ(torch.nn.Module):
        """Per-tensor int8 fake quantization (symmetric or not) with a held range (observe -> freeze)."""

        def __init__(self, symmetric: bool) -> None:
            super().__init__()
            self.symmetric = symmetric
            self.register_buffer("lo", torch.tensor(float("inf")))
            self.register_buffer("hi", torch.tensor(float("-inf")))
            self.register_buffer("scale", torch.tensor(1.0))
            self.register_buffer("zero_point", torch.tensor(0, dtype=torch.int32))
            self.learned: Any = None  # learn=True: the scale as a parameter (LSQ), from the held one
            self.mode = "off"  # off | observe | quant
            self.capture: list[Any] | None = None

        def freeze(self, learn: bool = False) -> None:
            lo, hi = min(float(self.lo), 0.0), max(float(self.hi), 0.0)
            if self.symmetric:  # TensorRT: zero point 0, the range [-127, 127] * scale
                self.scale.fill_(max(max(-lo, hi) / 127.0, 1e-8))
                self.zero_point.fill_(0)
            else:
                scale = max((hi - lo) / 255.0, 1e-8)
                self.scale.fill_(scale)
                self.zero_point.fill_(int(np.clip(round(-128 - lo / scale), -128, 127)))
            if learn:
                self.learned = torch.nn.Parameter(self.scale.detach().clone())
            self.mode = "quant"

        def held_range(self) -> tuple[float, float]:
            """The range the student quantizes to: min/max as observed, or the grid of the learned scale."""
            if self.learned is None:
                return float(self.lo), float(self.hi)
            s, zp = float(self.learned.detach().abs().clamp_min(1e-8)), int(self.zero_point)
            return (-127.0 * s, 127.0 * s) if self.symmetric else ((-128 - zp) * s, (127 - zp) * s)

        def _lsq(self, x):
            """Learned step size (Esser et al. 2020): round with a straight-through gradient, clamp to the grid;
            the scale's gradient is scaled by 1 / sqrt(elements x levels) as the paper does."""
            s = self.learned.abs().clamp_min(1e-8)
            g = 1.0 / float(np.sqrt(x[0].numel() * 127))
            s = s * g + (s - s * g).detach()
            zp = self.zero_point.float()
            q = torch.clamp(x / s + zp, -128.0, 127.0)  # as fake_quantize_per_tensor_affine and QuantizeLinear
            q = q + (torch.round(q) - q).detach()
            return (q - zp) * s

        def forward(self, x):
            if self.mode == "observe":
                with torch.no_grad():
                    self.lo.copy_(torch.minimum(self.lo, x.min().float()))
                    self.hi.copy_(torch.maximum(self.hi, x.max().float()))
            elif self.mode == "quant":
                with torch.autocast(x.device.type, enabled=False):
                    if self.learned is not None:
                        x = self._lsq(x.float())
                    else:
                        x = torch.fake_quantize_per_tensor_affine(x.float(), self.scale, self.zero_point, -128, 127)
            if self.capture is not None:
                self.capture.append(x)
            return x

    class WeightFQ(torch.nn.Module):
        """Per-channel (axis 0) symmetric int8 fake quantization; the scale follows the weight (max |w| / 127)."""

        def __init__(self) -> None:
            super().__init__()
            self.mode = "off"

        def forward(self, w):
            if self.mode != "quant":
                return w
            amax = w.detach().abs().reshape(w.shape[0], -1).amax(dim=1).float()
            scale = torch.clamp(amax / 127.0, min=1e-12)
            zp = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
            with torch.autocast(w.device.type, enabled=False):
                return torch.fake_quantize_per_channel_affine(w.float(), scale, zp, 0, -127, 127)

    return ActFQ, WeightFQ


def graph_module(model: Model):
    """The model's graph as a plain fx GraphModule: positional inputs -> tuple of outputs, no batch guard."""
    torch = require("torch")
    if model.is_tf:  # Keras / SavedModel: written to ONNX by tf2onnx (checked against TensorFlow), then bridged
        from edgekit.ingest_onnx import load_onnx
        from edgekit.tf_bridge import to_onnx_model

        model = to_onnx_model(model, load_onnx)
    if model.kind == "onnx":  # rebuilt in torch by the onnx2torch bridge, checked against onnxruntime there
        from edgekit.onnx_bridge import bridge_model

        model = bridge_model(model, model.source)
    if model.kind == "torchscript" or not model.is_torch:
        raise ModelLoadError(
            f"{model.source}: finetune needs a model it can trace (.pt2 ExportedProgram, ONNX, pkg.module:factory "
            f"or a pickled module); a {model.kind} model has no trainable graph here: export it with "
            "torch.export.save")
    ep = model.exported
    if ep is None:
        feeds = model.example_feeds()
        ep = torch.export.export(model.torch_module, tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs))
    with warnings.catch_warnings():  # torch's own deprecation notices (pytree specs) say nothing to the user
        warnings.simplefilter("ignore", FutureWarning)
        src = copy.deepcopy(ep.module())  # ep.module() shares the program's tensors: the caller's model stays as is
    graph = src.graph
    for n in list(graph.nodes):
        if n.op == "call_module" and n.target.startswith("_guards"):  # torch.export's input-shape guard
            graph.erase_node(n)
    graph._codegen = torch.fx.graph.CodeGen()  # plain positional in, flat tuple out
    gm = torch.fx.GraphModule(src, graph)
    gm.graph.lint()
    gm.recompile()
    return gm


def fold_batch_norms(gm) -> int:
    """Fold eval-mode batch norms that follow a convolution into its weight and bias (as the converters do)."""
    torch = require("torch")
    aten = torch.ops.aten
    folded = 0
    for bn in list(gm.graph.nodes):
        if bn.op != "call_function" or bn.target != aten.batch_norm.default:
            continue
        conv = bn.args[0]
        if (not isinstance(conv, torch.fx.Node) or conv.target != aten.conv2d.default or len(conv.users) != 1
                or bn.args[5] is not False):
            continue
        w_node = conv.args[1]
        b_node = conv.args[2] if len(conv.args) > 2 else None
        gamma, beta, mean, var = (gm.get_parameter(a.target) if a.target in dict(gm.named_parameters())
                                  else gm.get_buffer(a.target) for a in bn.args[1:5])
        eps = bn.args[7]
        with torch.no_grad():
            factor = gamma / torch.sqrt(var + eps)
            w = gm.get_parameter(w_node.target)
            w.mul_(factor.reshape(-1, *([1] * (w.dim() - 1))))
            b = gm.get_parameter(b_node.target) if b_node is not None else torch.zeros_like(mean)
            new_b = (b - mean) * factor + beta
        if b_node is None:
            name = w_node.target.replace(".", "_") + "_folded_bias"
            gm.register_parameter(name, torch.nn.Parameter(new_b))
            with gm.graph.inserting_before(conv):
                b_node = gm.graph.get_attr(name)
            args = list(conv.args) + [None] * (3 - len(conv.args))
            args[2] = b_node
            conv.args = tuple(args)
        else:
            with torch.no_grad():
                b.copy_(new_b)
        bn.replace_all_uses_with(conv)
        gm.graph.erase_node(bn)
        folded += 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, p in gm.named_parameters():  # the folded batch norms' own: left out of training (and of DDP)
        p.requires_grad_(name in used)
    return folded


# ops that move or pick values without making new ones: the targets carry their input's quantization through
_SHAPE_OPS = ("flatten", "view", "reshape", "_unsafe_view", "permute", "transpose", "squeeze", "unsqueeze",
              "contiguous", "clone", "dropout", "expand", "t", "getitem", "max_pool2d", "cat", "pad", "detach",
              "alias", "slice", "select", "split", "chunk", "unbind", "identity")
# what the targets fuse into the op before it: that op's output is not quantized on its own
_FUSED_NEXT = ("relu", "relu_", "relu6", "hardtanh", "hardtanh_", "batch_norm")


def _op_name(node) -> str:
    t = node.target
    return getattr(t, "__name__", str(t)).split(".")[0]


def insert_fake_quant(gm, symmetric: bool, inputs_only: bool = False) -> tuple[int, int]:
    """Fake-quantize conv/linear weights and the activations the target quantizes; returns (weights, activations).
    ``inputs_only`` (jetson): activations only where TensorRT's Q/DQ placement rounds them, at the inputs of
    convolutions, linear/matmul and average pooling (the tensorrt converter); else after every compute op."""
    torch = require("torch")
    ActFQ, WeightFQ = fq_modules()
    aten = torch.ops.aten
    graph = gm.graph
    n_w = n_a = 0
    if inputs_only:
        consumers = {aten.conv1d.default: 1, aten.conv2d.default: 1, aten.linear.default: 1, aten.matmul.default: 2,
                     aten.bmm.default: 2, aten.mm.default: 2, aten.avg_pool2d.default: 1,
                     aten.adaptive_avg_pool2d.default: 1}
        made: dict[Any, Any] = {}
        for node in list(graph.nodes):
            for x in node.args[:consumers.get(node.target, 0)] if node.op == "call_function" else ():
                val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
                if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point or x.op == "get_attr":
                    continue
                if x not in made:  # one range per tensor, shared by its quantized consumers (TensorRT's Q/DQ pairs)
                    name = f"fq_a{n_a}"
                    gm.add_submodule(name, ActFQ(symmetric))
                    with graph.inserting_after(x):
                        made[x] = graph.call_module(name, (x,))
                    n_a += 1
                node.replace_input_with(x, made[x])
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in (aten.conv2d.default, aten.linear.default,
                                                          aten.conv1d.default):
            w = node.args[1]
            if isinstance(w, torch.fx.Node) and w.op == "get_attr":
                name = f"fq_w{n_w}"
                gm.add_submodule(name, WeightFQ())
                with graph.inserting_after(w):
                    q = graph.call_module(name, (w,))
                node.replace_input_with(w, q)
                n_w += 1
    for node in list(graph.nodes) if not inputs_only else ():
        val = node.meta.get("val")
        is_float = isinstance(val, torch.Tensor) and val.dtype.is_floating_point
        if node.op == "placeholder":
            wanted = is_float
        elif node.op == "call_function" and is_float:
            users = list(node.users)
            wanted = (_op_name(node) not in _SHAPE_OPS
                      and not (users and all(u.op == "call_function" and _op_name(u) in _FUSED_NEXT for u in users)))
        else:
            wanted = False
        if not wanted:
            continue
        name = f"fq_a{n_a}"
        gm.add_submodule(name, ActFQ(symmetric))
        with graph.inserting_after(node):
            q = graph.call_module(name, (node,))
        node.replace_all_uses_with(q, delete_user_cb=lambda u, q=q: u is not q)
        n_a += 1
    graph.lint()
    gm.recompile()
    return n_w, n_a


def set_mode(module, mode: str) -> None:
    for m in module.modules():
        if type(m).__name__ in ("ActFQ", "WeightFQ"):
            m.mode = mode


def act_fqs(module) -> list[Any]:
    return [m for m in module.modules() if type(m).__name__ == "ActFQ"]


def capture(net, on: bool) -> list[Any] | None:
    """With ``on``: one list that every activation point of ``net`` appends what passes through it to."""
    if not on:
        return None
    store: list[Any] = []
    for a in act_fqs(net):
        a.capture = store
    return store


def uncapture(net) -> None:
    for a in act_fqs(net):
        a.capture = None
