"""An exact rewrite of an ONNX graph that leaves fewer places to quantize (run by ``onnx_prepare.prepare``).

Exporters write some layers as chains of elementwise ops: paddle2onnx writes PP-LCNet's learnable affine blocks as
``Mul(a, conv(x))`` then ``Add(.., b)``, and some BatchNorms the same way. A float runtime does not care; an INT8
build quantizes every op's output, so each link adds rounding on a per-tensor int8 grid. TensorRT fuses them
itself; the PT2E quantizers (android, ios) and hls4ml do not. Here a ``Conv`` / ``ConvTranspose`` followed by a
``Mul`` and/or an ``Add`` by a constant that is one value or one value per output channel is folded into the
layer's weights and bias (what BatchNormalization folding does), in float64: the same function up to float
rounding. (HardSwish written out as ``x * clip(x + 3, 0, 6) / 6`` is fused where it matters, in android's INT8
rewrites, converters/tflite/int8_rewrites.py: fused here, Core ML's fp16 rounding of the fused op moves
near-tie decisions.)"""

from __future__ import annotations

from typing import Any

import numpy as np


def subgraphs(node: Any) -> list[Any]:
    """The graphs inside a node (If branches, Loop / Scan bodies), nested ones included."""
    from onnx import AttributeProto

    out = []
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS else []
        for sg in graphs:
            out.append(sg)
            out += [x for m in sg.node for x in subgraphs(m)]
    return out


def _readers(graph) -> dict[str, list[Any]]:
    """Who reads each value: the graph's nodes, and None for a reader no rewrite may remove (a graph output, a node
    in a subgraph: an If branch may read an outer value by name)."""
    use: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            use.setdefault(i, []).append(n)
        for i in {i for sg in subgraphs(n) for m in sg.node for i in m.input}:
            use.setdefault(i, []).append(None)
    for o in graph.output:
        use.setdefault(o.name, []).append(None)
    return use


def _other(n, name: str) -> str | None:
    """The other input of the binary node ``n`` that reads ``name``."""
    if len(n.input) != 2:
        return None
    if n.input[0] == name:
        return n.input[1]
    if n.input[1] == name:
        return n.input[0]
    return None


def _only(use, name: str) -> Any:
    """The single reader of ``name`` when it is a ``Mul`` or an ``Add``, else None."""
    users = use.get(name, [])
    return users[0] if len(users) == 1 and users[0] is not None and users[0].op_type in ("Mul", "Add") else None


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
    output into that layer's weights and bias, as long as one follows. Returns the number of Mul and Add folded."""
    from onnx import numpy_helper

    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    use = _readers(graph)  # stays right: a fold renames the layer's output to the folded node's, read as before
    replaced: set[str] = set()
    done = 0
    for conv in [n for n in graph.node if n.op_type in ("Conv", "ConvTranspose")]:
        if len(conv.input) < 2 or conv.input[1] not in inits or (
                len(conv.input) > 2 and conv.input[2] and conv.input[2] not in inits):
            continue
        while (nxt := _only(use, conv.output[0])) is not None:
            k = _other(nxt, conv.output[0])
            if k is None or k not in inits:
                break
            w = numpy_helper.to_array(inits[conv.input[1]])
            group = next((a.i for a in conv.attribute if a.name == "group"), 1)
            out_ch = w.shape[0] if conv.op_type == "Conv" else w.shape[1] * group
            c = _per_channel(numpy_helper.to_array(inits[k]), out_ch, w.ndim)
            if c is None:
                break
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
            for name, value in ((tag + "_w", w64), (tag + "_b", b)):
                graph.initializer.append(numpy_helper.from_array(value.astype(w.dtype), name))
                inits[name] = graph.initializer[-1]
            replaced.update([*conv.input[1:], k])
            del conv.input[1:]
            conv.input.extend([tag + "_w", tag + "_b"])
            conv.output[0] = nxt.output[0]  # the layer now writes what the folded node wrote
            graph.node.remove(nxt)
            done += 1
    _drop_unread(graph, replaced)  # the weights, biases and constants replaced, where nothing else reads them
    return done


def _drop_unread(graph, names: set[str]) -> None:
    """Remove the initializers and Constant nodes among ``names`` that nothing reads any more (a rewrite's
    leftovers); a graph input, a graph output or a value another node reads stays."""
    if not names:
        return
    use = _readers(graph)
    gone = {n for n in names if n not in use and n not in {i.name for i in graph.input}}
    keep = [i for i in graph.initializer if i.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    for n in [n for n in graph.node if n.op_type == "Constant" and n.output[0] in gone]:
        graph.node.remove(n)


def fold_pad_into_maxpool(proto) -> int:
    """Fold a ``Pad`` with the value -inf (constant mode, spatial axes only) that alone feeds a ``MaxPool`` into the
    pool's own ``pads``: a max pool pads with -inf itself, so the function is the same. onnx2torch writes Keras'
    asymmetric SAME max pooling this way (``F.pad(x, (0, 1, 0, 1), value=-inf)``), and the padded tensor's
    -inf stops onnxruntime's histogram calibrators (jetson INT8) cold. Returns the number of Pads folded."""
    from onnx import helper, numpy_helper

    graph = proto.graph
    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    use = _readers(graph)
    outputs = {o.name for o in graph.output}
    replaced: set[str] = set()
    done = 0
    for pad in [n for n in graph.node if n.op_type == "Pad"]:
        mode = next((helper.get_attribute_value(a) for a in pad.attribute if a.name == "mode"), b"constant")
        if mode not in (b"constant", "constant") or len(pad.input) < 3 or len(pad.input) > 4 and pad.input[4]:
            continue
        pads, value = consts.get(pad.input[1]), consts.get(pad.input[2])
        readers = use.get(pad.output[0], [])
        if (pads is None or value is None or value.size != 1 or not np.isneginf(value.reshape(-1)[0])
                or pad.output[0] in outputs or len(readers) != 1 or readers[0] is None
                or readers[0].op_type != "MaxPool"):
            continue
        pool, rank = readers[0], len(pads) // 2
        attrs = {a.name: helper.get_attribute_value(a) for a in pool.attribute}
        p = [int(v) for v in pads.reshape(-1)]
        if (rank < 3 or min(p) < 0 or p[0] or p[1] or p[rank] or p[rank + 1] or attrs.get("ceil_mode", 0)
                or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")):
            continue
        spatial = rank - 2
        old = list(attrs.get("pads", [0] * 2 * spatial))
        new = [old[i] + p[2 + i] for i in range(spatial)] + [old[spatial + i] + p[rank + 2 + i] for i in range(spatial)]
        kept = [a for a in pool.attribute if a.name != "pads"]
        del pool.attribute[:]
        pool.attribute.extend([*kept, helper.make_attribute("pads", new)])
        pool.input[0] = pad.input[0]
        graph.node.remove(pad)
        replaced.update(pad.input[1:])
        done += 1
    _drop_unread(graph, replaced)  # the pad amounts and the -inf, where nothing else reads them
    return done


def depthwise_input_sites(proto) -> list[tuple[Any, Any, Any]]:
    """Where a depthwise convolution's input can be equalized per channel, exactly: ``(conv, relu or None,
    depthwise)`` for a Conv whose output alone feeds the depthwise Conv (one weight per channel and group, as many
    groups as channels), directly or through a ReLU that alone reads it. Scaling the conv's output channel ``c``
    by ``1/s`` and the depthwise's channel ``c`` by ``s`` then leaves the function as it was (ReLU commutes with a
    positive scale), and each weight initializer involved must be read by its layer only."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    use = _readers(graph)
    made = {o: n for n in graph.node for o in n.output}

    def alone(name: str, reader) -> bool:
        return use.get(name, []) == [reader]

    def weights_own(n) -> bool:
        return all(t in inits and alone(t, n) for t in n.input[1:] if t)

    sites = []
    for dw in graph.node:
        if dw.op_type != "Conv" or len(dw.input) < 2 or dw.input[1] not in inits or not weights_own(dw):
            continue
        dims = list(inits[dw.input[1]].dims)
        groups = next((a.i for a in dw.attribute if a.name == "group"), 1)
        if groups < 2 or len(dims) < 3 or dims[0] != groups or dims[1] != 1 or not alone(dw.input[0], dw):
            continue
        relu = made.get(dw.input[0])
        conv = relu
        if relu is not None and relu.op_type == "Relu":
            conv = made.get(relu.input[0])
            if not alone(relu.input[0], relu):
                continue
        else:
            relu = None
        if (conv is None or conv.op_type != "Conv" or len(conv.input) < 2 or conv.input[1] not in inits
                or not weights_own(conv) or inits[conv.input[1]].dims[0] != groups):
            continue
        sites.append((conv, relu, dw))
    return sites


def equalize_depthwise_inputs(proto, sites: list, channel_max: dict[str, np.ndarray],
                              floor: float = 2.0 ** -8) -> list[dict]:
    """Scale each site's (:func:`depthwise_input_sites`) conv output channel ``c`` by ``1/s_c`` and depthwise channel
    ``c`` by ``s_c``, ``s_c = max|x_c| / max_c max|x_c|`` from ``channel_max`` (the depthwise input's per-channel
    max |x| on calibration data, keyed by that tensor's name): every channel of the tensor between them then spans
    the same range, so its one per-tensor INT8 scale serves each channel alike. Per-channel int8 weights take the
    scales into their own per-channel scales, so the weights' rounding is unchanged. Channels under ``floor`` of
    the largest (dead ones too) are scaled as if at the floor. In float64, written back at the weights' dtype.
    Returns, per site, the tensor and its channel-range spread (largest / smallest) before."""
    from onnx import numpy_helper

    inits = {i.name: i for i in proto.graph.initializer}
    done = []
    for conv, _relu, dw in sites:
        t = dw.input[0]
        m = np.asarray(channel_max.get(t, []), np.float64)
        if m.size != inits[dw.input[1]].dims[0] or not np.all(np.isfinite(m)) or m.max() <= 0:
            continue
        s = np.maximum(m / m.max(), floor)
        shape = (-1,) + (1,) * (len(inits[conv.input[1]].dims) - 1)
        for name, scale in [(conv.input[1], 1 / s.reshape(shape)), (dw.input[1], s.reshape(shape))] + (
                [(conv.input[2], 1 / s)] if len(conv.input) > 2 and conv.input[2] else []):
            arr = numpy_helper.to_array(inits[name])
            inits[name].CopyFrom(numpy_helper.from_array((arr.astype(np.float64) * scale).astype(arr.dtype), name))
        done.append({"tensor": t, "spread": round(float(m.max() / max(m.min(), m.max() * floor)), 2)})
    return done
