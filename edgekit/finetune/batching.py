"""Batches through a student graph: whole batches where the graph takes any batch size, else a fixed-batch graph
run a chunk at a time inside one forward; a graph traced at batch 1 is freed to follow the batch where that is
safe."""

from __future__ import annotations

import numpy as np

from edgekit.deps import require


def chunked(student, chunk: int | None):
    """Run a batch through a graph exported at a fixed batch size, ``chunk`` samples at a time (one module,
    one forward: DistributedDataParallel sees one call per step)."""
    torch = require("torch")

    class Chunked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = student

        def forward(self, *xs):
            if chunk is None:
                return self.net(*xs)
            outs = [self.net(*(x[i:i + chunk] for x in xs)) for i in range(0, len(xs[0]), chunk)]
            return tuple(torch.cat([o[k] for o in outs]) for k in range(len(outs[0])))

    return Chunked()


def batch_chunk(student, xs) -> int | None:
    """None when the graph takes any batch size (checked against sample-by-sample results), else the model's."""
    torch = require("torch")
    n = min(4, len(xs[0]))
    with torch.no_grad():
        try:
            whole = student(*(x[:n] for x in xs))
        except Exception:  # noqa: BLE001 - a graph with a fixed batch (a reshape to it) refuses other sizes
            return 1
        one = [student(*(x[i:i + 1] for x in xs)) for i in range(n)]
    for k, w in enumerate(whole):
        if w.shape[:1] != (n,) or not torch.allclose(w, torch.cat([o[k] for o in one]), rtol=1e-4, atol=1e-5):
            return 1
    return None


def free_batch(gm) -> int:
    """Let a graph traced at batch 1 take any batch: a reshape from ``[1, ...]`` to ``[1, ...]`` with as many
    elements per sample (a ``[1, C, 1, 1] -> [1, C]`` before a classifier, as a graph simplifier folds it at a
    fixed shape) is rewritten to ``[-1, ...]``. Other ops may still hold the batch; the caller keeps the rewrite
    only where :func:`batch_chunk` finds whole batches equal to one sample at a time. Returns how many."""
    torch = require("torch")
    aten = torch.ops.aten
    done = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in (aten.reshape.default, aten.view.default,
                                                       aten._unsafe_view.default):
            continue
        inp = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
        out = n.meta.get("val")
        if inp is None or out is None or not inp.ndim or not out.ndim:
            continue
        try:
            dims_in, dims_out = [int(d) for d in inp.shape], [int(d) for d in out.shape]
        except (TypeError, ValueError):  # a symbolic size: the graph already follows some size
            continue
        if dims_in[0] == 1 and dims_out[0] == 1 and int(np.prod(dims_in[1:])) == int(np.prod(dims_out[1:])):
            n.args = (n.args[0], [-1, *dims_out[1:]])
            done += 1
    if done:
        gm.recompile()
    return done
