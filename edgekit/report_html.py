"""report.html for a plan: one self-contained file (PNGs embedded as data: URIs, no external URL).

Figures (also written beside it as PNG files): budget bars (estimate vs budget for each
resource), the Pareto front over the candidates (latency vs size, colour = accuracy where
measured, else compression), and per-layer latency and memory of the choice.
matplotlib is imported here only (the ``plan`` extra).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.deps import require
from edgekit.fsutil import atomic_dir, sha256_file

if TYPE_CHECKING:  # pragma: no cover
    from edgekit.planner import Plan


def _plt():
    mpl = require("matplotlib", "plan")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)
    return buf.getvalue()


def budget_bars(plan: Plan) -> bytes:
    from edgekit.planner import BUDGET_NAMES, fmt_budget

    plt = _plt()
    s = plan.choice
    keys = list(s.usage)
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(keys)))
    vals = [100 * s.usage[k] for k in keys]
    colors = ["#c0392b" if v > 100 else ("#e67e22" if v > 80 else "#27ae60") for v in vals]
    ax.barh(range(len(keys)), vals, color=colors)
    ax.axvline(100, color="black", lw=1, ls="--")
    ax.set_yticks(range(len(keys)))
    est = s.estimate
    values = {"ram_mb": est.ram_mb, "storage_mb": est.storage_mb, "latency_ms": est.latency_ms,
              "power_w": est.power_w, "energy_mj": est.energy_mj}
    ax.set_yticklabels([f"{BUDGET_NAMES[k]}\n{fmt_budget(k, values[k], 4)} / {fmt_budget(k, getattr(plan.budgets, k))}"
                        for k in keys], fontsize=8)
    ax.set_xlabel("% of budget (estimate)")
    ax.set_title(f"budgets: {est.candidate.label} on {plan.board}", fontsize=9)
    ax.invert_yaxis()
    return _png(fig)


def pareto(plan: Plan) -> bytes:
    plt = _plt()
    from edgekit.planner import compression_rank

    pts = plan.candidates
    fig, ax = plt.subplots(figsize=(7, 4.2))
    acc = {}
    for st in plan.eval_steps:
        acc[len(st.float_layers)] = st.accuracy
    from matplotlib.colors import BoundaryNorm, ListedColormap

    ranks = sorted({compression_rank(s.estimate.candidate)[:2] for s in pts})
    x = [s.estimate.storage_mb for s in pts]
    y = [s.estimate.latency_ms for s in pts]
    c = [ranks.index(compression_rank(s.estimate.candidate)[:2]) for s in pts]
    # a whole-number rank: one colour per rank, the colour bar ticked at each rank and nowhere between
    n = len(ranks)
    cmap = ListedColormap(plt.get_cmap("viridis")([i / max(n - 1, 1) for i in range(n)]))
    norm = BoundaryNorm([i - 0.5 for i in range(n + 1)], n)
    sc = ax.scatter(x, y, c=c, cmap=cmap, norm=norm, s=[40 if s.fits else 14 for s in pts],
                    marker="o", alpha=0.85, edgecolors=["black" if s.fits else "none" for s in pts])
    # Pareto front over (storage, latency) among fitting candidates
    fit = sorted((s for s in pts if s.fits), key=lambda s: (s.estimate.storage_mb, s.estimate.latency_ms))
    front, best = [], float("inf")
    for s in fit:
        if s.estimate.latency_ms < best:
            front.append(s)
            best = s.estimate.latency_ms
    if len(front) > 1:  # a front of one point is no line: the legend names only what is drawn
        ax.plot([s.estimate.storage_mb for s in front], [s.estimate.latency_ms for s in front], "k--", lw=1,
                label="Pareto front (fits)")
    ch = plan.choice.estimate
    label = "choice" + (f" (accuracy {plan.eval_steps[-1].accuracy:.2%})" if plan.eval_steps else "")
    ax.scatter([ch.storage_mb], [ch.latency_ms], marker="*", s=260, color="#c0392b", label=label, zorder=5)
    ax.axhline(plan.budgets.latency_ms, color="#c0392b", lw=0.8, ls=":", label="latency budget")
    ax.set_xlabel("weights storage (MB)")
    ax.set_ylabel("latency (ms, estimate)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    cb = fig.colorbar(sc, ax=ax, ticks=range(n))
    cb.set_label("compression rank (0 = none)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3, frameon=False)  # below: covers no point
    ax.set_title("candidates: latency vs size (big, outlined = fits every budget)", fontsize=9)
    return _png(fig)


def layers(plan: Plan) -> bytes:
    plt = _plt()
    ls = plan.choice.estimate.layers
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 0.6 + 0.28 * max(len(ls), 4)), sharey=True)
    ys = range(len(ls))
    a1.barh(ys, [lc.compute_ms * 1e3 for lc in ls], color="#2980b9", label="compute")
    a1.barh(ys, [lc.memory_ms * 1e3 for lc in ls], color="#e67e22", alpha=0.6, label="memory")
    a1.barh(ys, [lc.launch_ms * 1e3 for lc in ls], left=[max(lc.compute_ms, lc.memory_ms) * 1e3 for lc in ls],
            color="#7f8c8d", label="launch")
    if any(lc.passes_ms for lc in ls):  # the runtime's extra passes over the output (Q/DQ, casts)
        a1.barh(ys, [lc.passes_ms * 1e3 for lc in ls],
                left=[(max(lc.compute_ms, lc.memory_ms) + lc.launch_ms) * 1e3 for lc in ls],
                color="#c0392b", alpha=0.7, label="runtime passes")
    a1.set_xlabel("latency per layer (us, estimate)")
    # the legends sit above the axes, where they cover no bar
    a1.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, frameon=False)
    a1.set_yticks(list(ys))
    a1.set_yticklabels([f"{lc.name} ({lc.op}, {lc.precision})" for lc in ls], fontsize=7)
    a1.invert_yaxis()
    acts = {lay.name: lay.activation_bytes for lay in plan.stats.layers}
    a2.barh(ys, [lc.weight_bytes / 1e3 for lc in ls], color="#8e44ad", label="weights")
    a2.barh(ys, [acts.get(lc.name, 0) / 1e3 for lc in ls], left=[lc.weight_bytes / 1e3 for lc in ls],
            color="#16a085", label="output activation (fp32)")
    a2.set_xlabel("memory per layer (KB)")
    a2.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)
    fig.suptitle(f"per layer: {plan.choice.estimate.candidate.label}", fontsize=9, y=1.02)
    return _png(fig)


def render(plan: Plan, images: dict[str, bytes]) -> str:
    from edgekit.planner import BUDGET_NAMES, BUDGET_UNITS, fmt_budget
    from edgekit.units import fmt_mb

    def img(name: str) -> str:
        data = base64.b64encode(images[name]).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    e = plan.choice.estimate
    rows = []
    for s in plan.candidates:
        est = s.estimate
        chosen = est.candidate == e.candidate
        over = ("no: " + ", ".join(f"{BUDGET_NAMES[k]} +{fmt_budget(k, v, 4)}" for k, v in s.over.items()) if s.over
                else f"yes (tightest: {BUDGET_NAMES[s.binding]} {s.usage[s.binding]:.0%})")
        rows.append(
            f"<tr class='{'chosen' if chosen else ('ok' if s.fits else 'no')}'><td>{html.escape(est.candidate.label)}</td>"
            f"<td>{fmt_mb(est.ram_mb)}</td><td>{fmt_mb(est.storage_mb)}</td><td>{est.latency_ms:.4f}</td>"
            f"<td>{est.energy_mj:.4f}</td><td>{html.escape(over)}</td></tr>")
    steps = "".join(
        f"<li>{len(st.float_layers)} layer(s) kept float ({html.escape(', '.join(st.float_layers)) or 'none'}): "
        f"accuracy {st.accuracy:.2%}, float {st.float_accuracy:.2%}, drop {st.drop_points:.2f} points</li>"
        for st in plan.eval_steps)
    sens = "".join(f"<li>{html.escape(k)}: +{v:.2f} points when kept float</li>" for k, v in plan.sensitivity.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in plan.notes)
    b = plan.budgets
    budgets = ", ".join(f"{BUDGET_NAMES[k]} {fmt_budget(k, v) if k in BUDGET_UNITS else f'{v:g} points'}"
                        for k, v in b.to_json().items() if v is not None)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>edgekit plan: {html.escape(plan.board)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; }}
tr.chosen {{ background: #d5f5e3; font-weight: bold; }} tr.no {{ color: #999; }}
img {{ max-width: 100%; display: block; margin: 1em 0; }} .reason {{ background: #f4f6f7; padding: 0.6em; }}
</style></head><body>
<h1>edgekit plan — {html.escape(plan.board)} ({html.escape(plan.target)})</h1>
<p class="reason"><b>Choice:</b> {html.escape(plan.reason)}</p>
<p>Budgets: {html.escape(budgets)}.{' Cost model calibrated from measurements.' if plan.calibrated else ''}
Estimate: RAM {fmt_mb(e.ram_mb)} (weights {fmt_mb(e.weights_mb)} + activations {fmt_mb(e.activations_mb)} + runtime
{fmt_mb(e.runtime_overhead_mb)}), storage {fmt_mb(e.storage_mb)}, latency {e.latency_ms:.4f} ms, energy {e.energy_mj:.4f} mJ
at {e.power_w:g} W.</p>
{('<h2>Accuracy (measured)</h2><ul>' + steps + '</ul>') if steps else ''}
{('<h2>Per-layer sensitivity</h2><ul>' + sens + '</ul>') if sens else ''}
<h2>Budgets</h2>{img('budgets')}
<h2>Candidates</h2>{img('pareto')}
<table><tr><th>candidate</th><th>RAM</th><th>storage</th><th>latency ms</th><th>energy mJ</th>
<th>fits</th></tr>{''.join(rows)}</table>
<h2>Per layer</h2>{img('layers')}
{('<h2>Notes</h2><ul>' + notes + '</ul>') if notes else ''}
</body></html>
"""


def write_report(plan: Plan, out: str | Path) -> Path:
    """Write ``report.html``, the PNGs, ``plan.json`` and ``manifest.json`` into the folder ``out`` (replaced atomically)."""
    images = {"budgets": budget_bars(plan), "pareto": pareto(plan), "layers": layers(plan)}
    out = Path(out)
    with atomic_dir(out) as tmp:
        for name, data in images.items():
            (tmp / f"{name}.png").write_bytes(data)
        (tmp / "report.html").write_text(render(plan, images))
        (tmp / "plan.json").write_text(json.dumps(plan.to_json(), indent=2) + "\n")
        files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in sorted(tmp.iterdir())}
        man = {"schema_version": 2, "kind": "plan", "board": plan.board, "target": plan.target, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(man, indent=2) + "\n")
    return out / "report.html"
