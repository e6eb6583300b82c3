"""The fx recording interpreter over a PT2E fake-quant program: what each quantize node and each int8 weight
does to the values, on real feeds. It ranks the layers of a mixed-precision search (android's local SQNR,
Core ML's W8A8 layers)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.deps import require

WEIGHTED = ("conv", "linear")  # ops whose args[1] is a weight that PT2E quantizes per channel


def weight_noise(interp, n, out, acc: dict[str, list[float]]) -> None:
    """For a conv / linear of a fake-quant program (fx Interpreter ``interp`` running it) whose weight is
    dequantize(quantize(w)): the node run again with the float ``w`` on the same input, and the (signal, noise)
    energies of its output added to ``acc[n.name]``. A layer that sums large inputs into a small output (a
    detector head on a wide feature concat) loses its output to the int8 weights' rounding while its own
    activation quantizes well; ranked by the activation alone the search never measured it."""
    torch = require("torch")
    if n.op != "call_function" or len(n.args) < 2 or not any(k in str(n.target) for k in WEIGHTED):
        return
    w = n.args[1]
    if not isinstance(w, torch.fx.Node) or "dequantize" not in str(w.target):
        return
    src = w
    while isinstance(src, torch.fx.Node) and "quantize" in str(src.target) and src.args:
        src = src.args[0]
    if isinstance(src, torch.fx.Node) and src.op == "get_attr":  # the Interpreter has freed it after its last use
        weight = interp.fetch_attr(src.target)
    elif isinstance(src, torch.fx.Node) and src in interp.env:
        weight = interp.env[src]
    else:
        return
    args = list(torch.fx.node.map_arg(n.args, lambda a: interp.env[a]))
    kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: interp.env[a])
    args[1] = weight
    ref = n.target(*args, **kwargs).double()
    got = out.double()
    s = acc.setdefault(n.name, [0.0, 0.0])
    s[0] += float((ref ** 2).sum())
    s[1] += float(((got - ref) ** 2).sum())


def record_quantized(converted: Any, feeds: list[dict[str, np.ndarray]], m: Any, skip_dequantize: bool
                     ) -> tuple[dict[str, list[tuple[np.ndarray, np.ndarray]]], dict[str, list[float]]]:
    """``converted`` (a fake-quant program) run by an fx Interpreter on every feed. Returns ``(seen, weights)``:
    ``seen[input node name]``, per run, the value a quantize_per_tensor node takes and the same value rounded
    through its int8 grid (``(x, dequant(quant(x)))``), for the dequantize nodes too unless ``skip_dequantize``;
    ``weights[conv / linear node]``, the (signal, noise) energies its int8 weights add at its output
    (:func:`weight_noise`)."""
    torch = require("torch")
    seen: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    weights: dict[str, list[float]] = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if (n.op == "call_function" and "quantize_per_tensor" in str(n.target)
                    and not (skip_dequantize and "dequantize" in str(n.target))
                    and isinstance(n.args[0], torch.fx.Node)):
                x, scale, zp, lo, hi = (self.env[n.args[0]], *[self.env[a] if isinstance(a, torch.fx.Node) else a
                                                                 for a in n.args[1:5]])
                deq = (torch.clamp(torch.round(x / scale) + zp, lo, hi) - zp) * scale
                seen.setdefault(n.args[0].name, []).append((x.detach().numpy(), deq.detach().numpy()))
            weight_noise(self, n, out, weights)
            return out

    with torch.no_grad():
        for f in feeds:
            Rec(converted).run(*[torch.from_numpy(np.ascontiguousarray(f[s.name])) for s in m.inputs])
    return seen, weights


def reads_input(node) -> bool:
    """``node``'s first argument is a model input, through quantize / dequantize nodes only (the mixed search
    scans such a layer first: :class:`edgekit.mixed.search.Layer`)."""
    a = node.args[0] if node.args else None
    while getattr(a, "op", None) == "call_function" and "quantize" in str(a.target) and a.args:
        a = a.args[0]
    return getattr(a, "op", None) == "placeholder"
