"""Exact rewrites of an ONNX graph that leave fewer places to quantize (run by ``onnx_bridge.prepare``).

Exporters write some layers as chains of elementwise ops: paddle2onnx writes HardSwish as
``x * clip(x + 3, 0, 6) / 6`` and PP-LCNet's learnable affine blocks as ``Mul(a, conv(x))`` then ``Add(.., b)``.
A float runtime does not care; an INT8 build quantizes every op's output, so each link of such a chain adds
rounding and clipping on a per-tensor int8 grid (PP-OCRv4's detector: output SNR 0 dB, mask IoU 0.00 on
android). TensorRT fuses these chains itself; the PT2E quantizers (android, ios) and hls4ml do not. Here:

- ``HardSwish(x)`` for ``x * clip(x + 3, 0, 6) * (1/6)`` and for ``x * HardSigmoid(x; 1/6, 0.5)`` (opset 14;
  a graph below it is upgraded by the onnx version converter first);
- a ``Conv`` / ``ConvTranspose`` followed by a ``Mul`` and/or an ``Add`` by a constant that is one value or one
  value per output channel is folded into the layer's weights and bias (what BatchNormalization folding does).

Each rewrite computes the same function up to float rounding (the weights are multiplied in float64)."""

from __future__ import annotations

from typing import Any

import numpy as np

HARDSWISH_OPSET = 14


def _consumers(graph) -> dict[str, list[Any]]:
    use: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            use.setdefault(i, []).append(n)
    for o in graph.output:  # a graph output is a consumer no rewrite may remove
        use.setdefault(o.name, []).append(None)
    return use


def _const(inits: dict[str, Any], name: str) -> np.ndarray | None:
    from onnx import numpy_helper

    return numpy_helper.to_array(inits[name]) if name in inits else None


def _scalar(inits, name: str, value: float, rtol: float = 1e-6) -> bool:
    c = _const(inits, name)
    return (c is not None and c.size == 1 and c.dtype.kind == "f"
            and abs(float(c.ravel()[0]) - value) <= rtol * abs(value))


def _other(n, name: str) -> str | None:
    """The other input of the binary node ``n`` that reads ``name``."""
    if len(n.input) != 2:
        return None
    if n.input[0] == name:
        return n.input[1]
    if n.input[1] == name:
        return n.input[0]
    return None


def _only(use, name: str, op: str) -> Any:
    """The single consumer of ``name`` when it is an ``op`` node, else None."""
    users = use.get(name, [])
    return users[0] if len(users) == 1 and users[0] is not None and users[0].op_type == op else None


def _clip_0_6(n, inits) -> bool:
    if n.op_type != "Clip":
        return False
    if len(n.input) >= 3:  # opset 11+: min and max are inputs
        return _scalar(inits, n.input[1], 0.0, 0) and _scalar(inits, n.input[2], 6.0)
    att = {a.name: a.f for a in n.attribute}
    return att.get("min") == 0.0 and att.get("max") == 6.0


def _hardswish_sites(graph, inits) -> list[tuple[str, list[Any], str]]:
    """(input x, nodes to remove, output) of every HardSwish written out as elementwise ops."""
    use = _consumers(graph)
    sites = []
    for n in graph.node:
        if n.op_type == "Add" and len(n.input) == 2:
            for x in n.input:
                k = _other(n, x)
                if k is None or not _scalar(inits, k, 3.0) or x in inits:
                    continue
                clip = _only(use, n.output[0], "Clip")
                if clip is None or not _clip_0_6(clip, inits):
                    continue
                mul = _only(use, clip.output[0], "Mul")
                if mul is None or _other(mul, clip.output[0]) != x:
                    continue
                scale = _only(use, mul.output[0], "Mul")
                if scale is None or not _scalar(inits, _other(scale, mul.output[0]) or "", 1 / 6, 1e-5):
                    continue
                sites.append((x, [n, clip, mul, scale], scale.output[0]))
        elif n.op_type == "HardSigmoid":
            att = {a.name: a.f for a in n.attribute}
            if abs(att.get("alpha", 0.2) - 1 / 6) > 1e-6 or abs(att.get("beta", 0.5) - 0.5) > 1e-6:
                continue
            x = n.input[0]
            mul = _only(use, n.output[0], "Mul")
            if mul is not None and _other(mul, n.output[0]) == x:
                sites.append((x, [n, mul], mul.output[0]))
    return sites


def fuse_hardswish(proto) -> tuple[Any, int]:
    """Each written-out HardSwish as one ``HardSwish`` node. Returns (proto, count); the proto is upgraded to
    opset 14 where it was lower and a site was found (it is returned unchanged where the upgrade fails)."""
    import onnx
    from onnx import helper

    inits = {i.name: i for i in proto.graph.initializer}
    if not _hardswish_sites(proto.graph, inits):
        return proto, 0
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < HARDSWISH_OPSET:
        try:
            proto = onnx.version_converter.convert_version(proto, HARDSWISH_OPSET)
        except Exception:  # the converter raises per op: the chains stay as they are
            return proto, 0
        inits = {i.name: i for i in proto.graph.initializer}
    graph = proto.graph
    done = 0
    for x, nodes, out in _hardswish_sites(graph, inits):
        at = min(list(graph.node).index(nd) for nd in nodes)
        for nd in nodes:
            graph.node.remove(nd)
        graph.node.insert(at, helper.make_node("HardSwish", [x], [out], name=f"{nodes[0].name or out}/hardswish"))
        done += 1
    return proto, done


def _per_channel(c: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``c`` as one value per output channel where it broadcasts that way against an NC... tensor."""
    if c.dtype.kind != "f" or not np.all(np.isfinite(c)):
        return None
    if c.size == 1:
        return np.full(channels, float(c.ravel()[0]))
    if c.ndim > rank or c.size != channels:
        return None
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)  # right-aligned as broadcasting aligns it
    return c.reshape(channels).astype(np.float64) if shape[1] == channels else None


def fold_affine_into_conv(proto) -> int:
    """Fold ``Mul`` / ``Add`` by a per-channel (or single) constant that alone reads a Conv / ConvTranspose's
    output into that layer's weights and bias. Returns the number of Mul and Add nodes folded."""
    from onnx import numpy_helper

    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    done = 0
    changed = True
    while changed:
        changed = False
        use = _consumers(graph)
        for conv in graph.node:
            if conv.op_type not in ("Conv", "ConvTranspose") or len(conv.input) < 2 or conv.input[1] not in inits:
                continue
            if len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits:
                continue
            nxt = _only(use, conv.output[0], "Mul") or _only(use, conv.output[0], "Add")
            if nxt is None:
                continue
            k = _other(nxt, conv.output[0])
            if k is None or k not in inits:
                continue
            w = numpy_helper.to_array(inits[conv.input[1]])
            group = next((a.i for a in conv.attribute if a.name == "group"), 1)
            out_ch = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * group
            c = _per_channel(numpy_helper.to_array(inits[k]), out_ch, w.ndim)
            if c is None:
                continue
            has_b = len(conv.input) > 2 and bool(conv.input[2])
            b = numpy_helper.to_array(inits[conv.input[2]]).astype(np.float64) if has_b else np.zeros(out_ch)
            w64 = w.astype(np.float64)
            if nxt.op_type == "Mul":
                if conv.op_type == "Conv":
                    w64 = w64 * c.reshape((-1,) + (1,) * (w.ndim - 1))
                else:  # ConvTranspose weight: [in, out/group, k...]
                    cg = c.reshape(group, -1)
                    w64 = (w64.reshape((group, -1) + w.shape[1:])
                           * cg.reshape((group, 1, -1) + (1,) * (w.ndim - 2))).reshape(w.shape)
                b = b * c
            else:
                b = b + c
            tag = f"{conv.name or conv.output[0]}/folded_{done}"
            graph.initializer.append(numpy_helper.from_array(w64.astype(w.dtype), tag + "_w"))
            graph.initializer.append(numpy_helper.from_array(b.astype(w.dtype), tag + "_b"))
            inits[tag + "_w"] = graph.initializer[-2]
            inits[tag + "_b"] = graph.initializer[-1]
            del conv.input[1:]
            conv.input.extend([tag + "_w", tag + "_b"])
            conv.output[0] = nxt.output[0]  # the layer now writes what the folded node wrote
            graph.node.remove(nxt)
            done += 1
            changed = True
            break
    if done:  # initializers nothing reads any more
        read = {i for n in graph.node for i in n.input}
        keep = [i for i in graph.initializer if i.name in read or i.name in {o.name for o in graph.output}]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return done
