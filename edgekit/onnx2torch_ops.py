"""The ONNX ops edgekit adds to onnx2torch (registered once, before a graph is converted): ops onnx2torch 1.5
lacks (LSTM), and converters for ops whose parameters are constants once the graph is folded at fixed shapes
(Reshape, Slice, Squeeze, Pad, Resize, ...), so the torch module holds them as Python numbers that torch.export
can trace."""

from __future__ import annotations

import numpy as np

from edgekit.deps import require
from edgekit.errors import UnsupportedOpError


_REGISTERED = False


def register_extra_converters() -> None:
    """ONNX ops onnx2torch 1.5 lacks and real edge models use."""
    global _REGISTERED
    if _REGISTERED:
        return
    torch = require("torch")
    from edgekit._vendor.onnx2torch.node_converters.registry import add_converter
    from edgekit._vendor.onnx2torch.utils.common import OnnxMapping, OperationConverterResult

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

    from edgekit._vendor.onnx2torch.node_converters import registry

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

    class ConstPReLU(torch.nn.Module):
        """PRelu with a constant slope as ``F.prelu`` where the slope is one per channel of axis 1 (or one value),
        else ``where(x >= 0, x, x * slope)``. onnx2torch's own writes ``out[x >= 0] = x[...]`` for a slope such
        as keras2onnx's [1, C, 1, 1], which torch.export cannot trace (boolean indexing); ``aten.prelu`` is also
        what the targets' PReLU lowering and int8 rewrites take."""

        def __init__(self, slope):
            super().__init__()
            slope = np.ascontiguousarray(slope, dtype=np.float32)
            self.register_buffer("slope", torch.from_numpy(slope))
            self.register_buffer("weight", torch.from_numpy(slope.reshape(-1).copy()))  # F.prelu's, per channel

        def forward(self, x):
            s = self.slope
            shape = [1] * (x.dim() - s.dim()) + list(s.shape)
            if s.numel() == 1 or (x.dim() >= 2 and len(shape) == x.dim() and shape[1] == x.shape[1]
                                  and all(d == 1 for i, d in enumerate(shape) if i != 1)):
                return F_prelu(x, self.weight)
            return torch.where(x >= 0, x, x * s)

    F_prelu = torch.nn.functional.prelu

    def prelu(node, graph):
        slope = node.input_values[1] if len(node.input_values) > 1 else ""
        if slope not in graph.initializers:
            return None
        return OperationConverterResult(torch_module=ConstPReLU(graph.initializers[slope].to_numpy()),
                                        onnx_mapping=OnnxMapping(inputs=(node.input_values[0],),
                                                                 outputs=tuple(node.output_values)))

    static_first("PRelu", prelu)
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
        if any(v < 0 for v in pads):
            raise UnsupportedOpError(f"Pad node {node.name!r}: {mode} padding with negative pads {pads} (a crop) "
                                     "is not bridged to torch")
        return result(node, lambda x: pad_trailing(x, pads, tmode), f"Pad({pads}, {mode})")

    def pad_trailing(x, pads, tmode):
        """Reflect / replicate padding on any rank: torch pads only the last 1-3 dims of a 2-D..5-D tensor
        (one leading dim, or two). The padded dims, moved last where they are not, with every dim before them
        folded into one, are what it takes; the result is unfolded and moved back. Padding is separable, so
        more than three padded dims are padded three at a time."""
        rank = x.dim()
        padded = [d for d in range(rank) if pads[d] or pads[d + rank]]
        for k in range(0, len(padded), 3):
            group = padded[k:k + 3]
            order = [d for d in range(rank) if d not in group] + group
            moved = order != list(range(rank))
            y = x.permute(order) if moved else x
            tp = []
            for d in reversed(group):
                tp += [pads[d], pads[d + rank]]
            if rank - len(group) in (1, 2):  # as torch takes it
                y = F.pad(y, tp, mode=tmode)
            else:  # [B, *padded dims]
                lead, tail = list(y.shape[:rank - len(group)]), list(y.shape[rank - len(group):])
                y = F.pad(y.reshape([-1] + tail), tp, mode=tmode)
                y = y.reshape(lead + list(y.shape[1:]))
            x = y.permute([order.index(d) for d in range(rank)]) if moved else y
        return x

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

    def gather(node, graph):  # a constant index (a recurrent state's layer: state[0]) taken as Python ints
        p = params(node, graph)
        if p is None or not p or p[0] is None or p[0].ndim > 1 or const(graph, node.input_values[0]) is not False:
            return None
        axis, index = int(node.attributes.get("axis", 0)), p[0]
        if index.ndim == 0:
            i = int(index)
            return result(node, lambda x: torch.select(x, axis, i + x.shape[axis] if i < 0 else i),
                          f"Gather({i}, axis={axis})")
        rows = [int(v) for v in index]
        return result(node, lambda x: torch.index_select(x, axis, torch.tensor(
            [r + x.shape[axis] if r < 0 else r for r in rows], dtype=torch.long)), f"Gather({rows}, axis={axis})")

    def split(node, graph):  # sizes as Python ints: onnx2torch's ``split.tolist()`` gives torch.export unbacked
        # symbols (YOLOv8's C2f and DFL head: litert-torch's ConcretizationTypeError, Core ML's
        # PendingUnbackedSymbolNotFound)
        axis, n = int(node.attributes.get("axis", 0)), len(node.output_values)
        sizes = node.attributes.get("split")  # opset < 13: an attribute
        if len(node.input_values) > 1 and node.input_values[1]:
            p = const(graph, node.input_values[1])
            if p is False or p is None:
                return None
            sizes = p
        if sizes is not None:
            sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
            return result(node, lambda x: torch.split(x, sizes, dim=axis), f"Split({sizes}, axis={axis})")
        # no sizes: n equal parts, the last one smaller where the axis does not divide (opset 18 num_outputs)
        return result(node, lambda x: torch.split(x, -(-x.shape[axis] // n), dim=axis), f"Split({n} parts, axis={axis})")

    def pow_(node, graph):  # a constant scalar exponent as a Python number: x ** 2 as x * x (YOLOv5's anchor
        # decoding, (2 * sigmoid) ** 2); onnx2torch's pow(x, tensor) lowers to a tfl.pow that litert-torch refuses
        p = params(node, graph)
        if p is None or p[0] is None or np.asarray(p[0]).size != 1:
            return None
        e = float(np.asarray(p[0]).reshape(-1)[0])
        if e == 2.0:
            return result(node, lambda x: x * x, "Pow(2) as x * x")
        if e == 1.0:
            return result(node, lambda x: x, "Pow(1)")
        if e == 0.5:
            return result(node, torch.sqrt, "Pow(0.5) as sqrt")
        return result(node, lambda x: torch.pow(x, e), f"Pow({e:g})")

    return {"Slice": slice_, "Squeeze": squeeze, "Unsqueeze": unsqueeze, "Pad": pad, "Resize": resize,
            "Expand": expand, "Tile": tile, "Clip": clip, "Gather": gather, "Split": split, "Pow": pow_}
