"""Exact rewrites of a prepared ONNX graph for what the targets' quantizers and runtimes take (run by
``edgekit.onnx_prepare.prepare`` after constants are folded): a Div by a constant becomes a Mul, and an ``If``
with a data-dependent condition becomes both branches and a ``Where``."""

from __future__ import annotations

import numpy as np


def div_by_constant_to_mul(proto) -> int:
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


def if_to_where(proto) -> list[str]:
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


AUTO_PAD_OPS = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})


def explicit_auto_pads(proto) -> int:
    """``auto_pad=SAME_UPPER`` / ``SAME_LOWER`` (keras2onnx writes them: MTCNN, most Keras-era models) written out
    as the explicit ``pads`` the ONNX spec defines for the node's input shape (onnx2torch translates only
    ``NOTSET`` and ``VALID``). In place; a node whose input shape is not known after shape inference is left."""
    from onnx import helper, shape_inference

    graph = proto.graph
    todo = [n for n in graph.node if n.op_type in AUTO_PAD_OPS and n.domain in ("", "ai.onnx")
            and any(a.name == "auto_pad" and a.s in (b"SAME_UPPER", b"SAME_LOWER") for a in n.attribute)]
    if not todo:
        return 0
    inferred = shape_inference.infer_shapes(proto).graph
    dims: dict[str, list[int]] = {}
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        shape = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        if shape and all(shape):
            dims[vi.name] = shape
    inits = {i.name: list(i.dims) for i in graph.initializer}
    done = 0
    for n in todo:
        shape = dims.get(n.input[0])
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Conv":
            kernel = attrs.get("kernel_shape") or (inits.get(n.input[1]) or dims.get(n.input[1]) or [])[2:]
        else:
            kernel = attrs.get("kernel_shape") or []
        if shape is None or not kernel or len(shape) != len(kernel) + 2:
            continue
        rank = len(kernel)
        strides = attrs.get("strides") or [1] * rank
        dilations = attrs.get("dilations") or [1] * rank
        begin, end = [], []
        for size, k, s, d in zip(shape[2:], kernel, strides, dilations, strict=True):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            begin.append(small if attrs["auto_pad"] == b"SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        kept = [a for a in n.attribute if a.name not in ("auto_pad", "pads")]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute("pads", begin + end)])
        done += 1
    return done
