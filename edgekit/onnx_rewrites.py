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
