"""Per-output verification metrics of example models at each precision (jetson target, host board).

Run with the code of two commits to compare what host verification reports before and after a change:

    python bench/verify_metrics.py --models DIR            # writes DIR/*.pt2 and the sorted eval file, then runs
    PYTHONPATH=<other checkout> python bench/verify_metrics.py --models DIR --no-build

The eval file is the digits eval set sorted by class (its first samples are all zeros), as a user's
"first N" data file often is. Prints one JSON line per (model, precision) and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def build(models: Path) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from plan_nets import two_heads

    models.mkdir(parents=True, exist_ok=True)
    net = two_heads()
    torch.export.save(torch.export.export(net, (torch.zeros(1, 1, 8, 8),)), str(models / "two_heads.pt2"))
    with np.load(ROOT / "examples" / "digits" / "eval.npz") as z:
        x, y = z["image"], z["label"]
    order = np.argsort(y, kind="stable")
    np.savez(models / "eval_sorted.npz", image=x[order], label=y[order])


def run(models: Path) -> list[dict]:
    from edgekit.errors import VerificationError
    from edgekit.pipeline import convert

    rows = []
    for name, path in (("digits_cnn", ROOT / "examples" / "digits" / "digits_cnn.pt2"),
                       ("two_heads", models / "two_heads.pt2")):
        for prec in ("fp32", "fp16", "int8"):
            out = Path(tempfile.mkdtemp()) / "b"
            kw = dict(board="host", precision=prec, calib=str(ROOT / "examples" / "digits" / "calib.npz"),
                      eval_data=str(models / "eval_sorted.npz"))
            try:
                convert(path, "jetson", out, **kw)
            except VerificationError:
                pass  # a failed build is kept, marked failed: its manifest says why
            man = json.loads((out / "manifest.json").read_text())
            ver = man["verification"]
            rows.append({
                "model": name, "precision": prec, "passed": ver["passed"], "golden": ver["golden_samples"],
                "eval_output": ver.get("eval_output", "(output 0)"),
                "float_acc": ver["float_accuracy"], "conv_acc": ver["converted_accuracy"],
                "outputs": [{k: o.get(k) for k in ("name", "kind", "max_rel_error", "top1_agreement", "metrics")}
                            for o in ver["outputs"]],
                "failures": ver["failures"],
            })
            print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | precision | golden | output: kind, metrics | labels scored on | accuracy float → conv | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        outs = "; ".join(
            f"{o['name']}: {o.get('kind') or '—'}, rel {o['max_rel_error']:.2%}"
            + (f", top-1 {o['top1_agreement']:.1%}" if o.get("top1_agreement") is not None else "")
            + (f", SNR {o['metrics']['snr_db']:.1f} dB" if (o.get("metrics") or {}).get("snr_db") is not None else "")
            for o in r["outputs"])
        acc = "—" if r["float_acc"] is None else f"{r['float_acc']:.1%} → {r['conv_acc']:.1%}"
        lines.append(f"| {r['model']} | {r['precision']} | {r['golden']} | {outs} | {r['eval_output']} | {acc} | "
                     f"{'pass' if r['passed'] else 'FAIL: ' + '; '.join(f[:70] for f in r['failures'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("bench/out/verify_metrics"))
    ap.add_argument("--no-build", action="store_true", help="use the models and data already in --models")
    a = ap.parse_args()
    if not a.no_build:
        build(a.models)
    print(table(run(a.models)))
