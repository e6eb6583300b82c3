"""LiteRT interpreter latency, int8 vs fp32, for the Android target (host CPU, XNNPACK).

    python bench/bench_android.py [--out /tmp/edgekit-bench-android]

Converts the digits CNN and the MobileNetV2-shaped network (examples/mbv2_digits) with the
real pipeline at fp32 and int8 (full integer) and prints, per build: conversion time, ops,
TRANSPOSE count, full-integer status, artifact size, float vs converted accuracy, and the
interpreter's median latency at 1 and 2 threads.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--size", type=int, default=0,
                    help="also time an untrained MBv2-shaped net at SIZE x SIZE (latency only; random calibration)")
    args = ap.parse_args()
    import android_nets

    from edgekit.pipeline import convert

    out = Path(args.out or tempfile.mkdtemp(prefix="edgekit-bench-android-"))
    calib, ev = android_nets.write_data(out / "mbv2data")
    models = {
        "digits": (ROOT / "examples/digits/digits_cnn.pt2", ROOT / "examples/digits/calib.npz",
                   ROOT / "examples/digits/eval.npz"),
        "mbv2-16": (ROOT / "examples/mbv2_digits/mbv2.pt2", calib, ev),
    }
    if args.size:
        import torch

        net = android_nets._build().eval()
        ep = torch.export.export(net, (torch.rand(1, 3, args.size, args.size),))
        torch.export.save(ep, str(out / "mbv2-big.pt2"))
        models[f"mbv2-{args.size}-untrained"] = (out / "mbv2-big.pt2", "random", None)
    rows = []
    for name, (model, cal, evl) in models.items():
        for prec in ("fp32", "int8"):
            res = convert(model, "android", out / f"{name}-{prec}", precision=prec, calib=str(cal),
                          eval_data=str(evl) if evl else None)
            a, v = res.manifest["artifact"], res.verification
            rows.append((name, prec, a["conversion_s"], sum(a["op_counts"].values()), a["transpose"]["total"],
                         a.get("full_integer", "-"), res.manifest["files"][a["primary"]]["bytes"] / 1e3,
                         100 * (v.float_accuracy or 0), 100 * (v.converted_accuracy or 0),
                         a["host_latency_ms"]["1"], a["host_latency_ms"]["2"]))
    head = ("model", "prec", "conv s", "ops", "TRANSPOSE", "full int8", "KB", "float acc", "acc",
            "1 thr ms", "2 thr ms")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| %s | %s | %.1f | %d | %d | %s | %.1f | %.2f | %.2f | %.4f | %.4f |" % r)
    for name in models:
        f32 = next(r for r in rows if r[0] == name and r[1] == "fp32")
        i8 = next(r for r in rows if r[0] == name and r[1] == "int8")
        print(f"{name}: int8 / fp32 latency = {i8[9] / f32[9]:.2f} (1 thread), {i8[10] / f32[10]:.2f} (2 threads)")


if __name__ == "__main__":
    main()
