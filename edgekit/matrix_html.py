"""``matrix.html``: one self-contained page (no script, no external file) for an `edgekit matrix` run: heat maps of
status, accuracy drop (or float agreement where no --eval data was given), size and estimated latency per cell
(rows: models; columns: board × precision), then every cell that did not pass, with its one-line reason."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from edgekit.units import fmt_bytes

STATUS_COLOUR = {"pass": "#2e9d4f", "failed": "#d7301f", "error": "#7f0000", "refused": "#e89a3c", "skipped": "#bdbdbd"}
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 24px}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:center}th{background:#f3f3f3}td.l,th.l{text-align:left}
td.c{min-width:84px;color:#111}.k{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
code{font-size:12px}"""


def _heat(share: float) -> str:
    """0 (best) → green, 1 (worst) → red, as a light background."""
    return f"hsl({120 * (1 - min(max(share, 0.0), 1.0)):.0f},70%,72%)"


def _span(values: list[float], log: bool) -> tuple[float, float]:
    vals = [math.log10(v) if log else v for v in values if v is not None and (v > 0 or not log)]
    return (min(vals), max(vals)) if vals else (0.0, 1.0)


def _metric(c: dict[str, Any], name: str) -> tuple[float | None, str]:
    """(share 0 best..1 worst or None, label) of one metric of one cell."""
    if c["status"] not in ("pass", "failed"):
        return None, "—"
    if name == "accuracy":
        if c.get("accuracy_drop_points") is not None:
            d = c["accuracy_drop_points"]
            return d / 2.0, f"{d:+.2f} pts"  # 2 points of accuracy lost reads as red
        if c.get("top1_agreement") is not None:
            a = c["top1_agreement"]
            return (1 - a) * 10, f"agree {a:.1%}"  # 10% disagreement reads as red
        e = c.get("max_rel_error")
        return (None, "—") if e is None else (e * 10, f"err {e:.2%}")
    v = c.get("artifact_bytes" if name == "size" else "estimated_latency_ms")
    if v is None:
        return None, "—"
    return v, (fmt_bytes(v) if name == "size" else f"{v:.3g} ms")


def _grid(cells: list[dict[str, Any]], title: str, name: str, note: str) -> str:
    models = list(dict.fromkeys(c["model"] for c in cells))
    cols = list(dict.fromkeys((c["board"], c["precision"]) for c in cells))
    by = {(c["model"], c["board"], c["precision"]): c for c in cells}
    span = None
    if name in ("size", "latency"):  # scaled over the matrix, on a log axis
        span = _span([_metric(c, name)[0] for c in cells], log=True)
    head = "".join(f"<th>{escape(b)}<br><small>{escape(p)}</small></th>" for b, p in cols)
    rows = []
    for m in models:
        tds = []
        for b, p in cols:
            c = by.get((m, b, p))
            if c is None:
                tds.append("<td></td>")
                continue
            if name == "status":
                colour, text = STATUS_COLOUR[c["status"]], f"<b style='color:#fff'>{c['status']}</b>"
            else:
                share, text = _metric(c, name)
                if share is not None and span is not None:
                    lo, hi = span
                    share = 0.0 if hi <= lo else (math.log10(share) - lo) / (hi - lo)
                colour = "#f7f7f7" if share is None else _heat(share)
            tip = escape(f"{c['id']} ({c['target']}): {c['status']}" + (f": {c['reason']}" if c.get("reason") else ""))
            tds.append(f"<td class=c style='background:{colour}' title='{tip}'>{text}</td>")
        rows.append(f"<tr><th class=l>{escape(m)}</th>{''.join(tds)}</tr>")
    return (f"<h2>{escape(title)}</h2><p><small>{escape(note)}</small></p>"
            f"<table><tr><th class=l>model</th>{head}</tr>{''.join(rows)}</table>")


def render(matrix: dict[str, Any]) -> str:
    cells = matrix["cells"]
    tot = matrix["totals"]
    legend = "".join(f"<span class=k style='background:{STATUS_COLOUR[s]}'></span>{s} {tot.get(s, 0)}"
                     for s in STATUS_COLOUR)
    parts = [
        f"<!doctype html><html><head><meta charset=utf-8><title>edgekit matrix</title><style>{CSS}</style></head><body>",
        f"<h1>edgekit matrix: {len(cells)} cells</h1>",
        f"<p>spec <code>{escape(matrix['spec'])}</code> · {escape(matrix['runner'])} · {matrix['wall_s']:.1f} s · "
        f"edgekit {escape(str(matrix['edgekit']))}</p><p>{legend}</p>",
        _grid(cells, "Status", "status", "host verification against the float model; hover a cell for its reason"),
        _grid(cells, "Accuracy drop (or float agreement)", "accuracy",
              "float minus converted accuracy on the model's eval data, in points; without eval data the top-1 "
              "agreement with the float model on the golden samples (or the max relative error)"),
        _grid(cells, "Size", "size", "the artifact the board loads (colour: log scale over this matrix)"),
        _grid(cells, "Estimated latency", "latency",
              "the planner's estimate in each build's manifest for its board (colour: log scale over this matrix)"),
    ]
    bad = [c for c in cells if c["status"] != "pass"]
    if bad:
        rows = "".join(
            f"<tr><td class=l>{escape(c['id'])}</td><td style='background:{STATUS_COLOUR[c['status']]};color:#fff'>"
            f"{c['status']}</td><td class=l>{escape(c.get('reason') or '')}</td>"
            f"<td class=l><code>{escape(c['log'])}</code></td></tr>" for c in bad)
        parts.append(f"<h2>Cells that did not pass ({len(bad)})</h2><table><tr><th class=l>cell</th><th>status</th>"
                     f"<th class=l>reason</th><th class=l>log</th></tr>{rows}</table>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
