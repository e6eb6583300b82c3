"""Keras / SavedModel input on the Android target: TensorFlow's TFLiteConverter at every precision.

    python bench/bench_android_keras.py [--out /tmp/edgekit-bench-keras] [--epochs 12]

Trains the Keras digits CNN of tests/test_android_keras.py (conv-BN-ReLU, strided conv, dense;
NHWC) on scikit-learn's digits, saves it as .keras and as a SavedModel, converts both with the
real pipeline at fp32, fp16, int8-dynamic and int8 (full integer, 200 calibration samples) and
prints, per build: conversion time (fp32: the analyze stage's conversion, reused), ops,
TRANSPOSE count, full-integer status, artifact size, float vs converted accuracy on the 450
held-out digits, and the LiteRT interpreter's median latency at 1 and 2 threads.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def train(out: Path, epochs: int) -> dict[str, Path]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
    from keras_digits import train_and_save

    t0 = time.perf_counter()
    kd = train_and_save(out, epochs)
    print(f"trained {epochs} epochs in {time.perf_counter() - t0:.1f} s; "
          f"params {kd['params']} (Keras count, BatchNorm included)")
    return {".keras": kd["keras"], "SavedModel": kd["saved_model"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--epochs", type=int, default=12)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="edgekit-bench-keras-"))
    t0 = time.perf_counter()
    from edgekit.tf_graph import import_tensorflow

    import_tensorflow()
    print(f"import tensorflow: {time.perf_counter() - t0:.1f} s")
    paths = train(out / "data", args.epochs)
    from edgekit.pipeline import convert

    rows = []
    for name, model in paths.items():
        for prec in ("fp32", "fp16", "int8-dynamic", "int8"):
            res = convert(str(model), "android", out / f"{model.stem}-{prec}", precision=prec,
                          calib=str(out / "data/calib.npz"), eval_data=str(out / "data/eval.npz"))
            a, v = res.manifest["artifact"], res.verification
            rows.append((name, prec, a["conversion_s"], res.timings_s["ingest"], sum(a["op_counts"].values()),
                         ", ".join(f"{k}×{n}" for k, n in sorted(a["op_counts"].items())), a["transpose"]["total"],
                         a.get("full_integer", "–"), res.manifest["files"][a["primary"]]["bytes"] / 1e3,
                         100 * v.float_accuracy, 100 * v.converted_accuracy,
                         a["host_latency_ms"]["1"], a["host_latency_ms"]["2"]))
    head = ("input", "prec", "conversion s", "ingest s", "ops", "op list", "TRANSPOSE", "full int8", "KB",
            "float acc %", "acc %", "1 thr ms", "2 thr ms")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(
            (f"{x:.4f}" if i >= len(r) - 2 else f"{x:.2f}") if isinstance(x, float) else
            ("yes" if x is True else "no" if x is False else str(x)) for i, x in enumerate(r)) + " |")


if __name__ == "__main__":
    main()
