"""edgekit convert --target jetson --precision int8 vs the raw toolchain calls, side by side.

Raw path = what a user would otherwise write: torch.export.load -> torch.onnx.export
(dynamo, opset 18) -> onnxslim -> onnxruntime quant_pre_process -> quantize_static (QDQ,
symmetric, per-channel, MinMax) on the same calibration data. edgekit adds ingest checks,
analysis (op-support + liveness), host verification (golden + eval accuracy on
onnxruntime), golden files, runner copy, manifest hashes, report, atomic output.

    python bench/convert_overhead.py [--repeats 3] [--no-eval]

Prints median wall time of each and the ratio, measured in this one run (alternating
order so warm caches favour neither), plus `edgekit --help` wall time in a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"


def raw_toolchain(model: Path, calib: Path, out: Path) -> None:
    import logging

    import onnx
    import onnxslim
    import torch
    from onnxruntime import quantization as q
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    ep = torch.export.load(str(model))
    x = torch.zeros(1, 1, 8, 8)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(ep, (x,), dynamo=True, opset_version=18).save(str(out / "exported.onnx"))
        onnx.save(onnxslim.slim(onnx.load(str(out / "exported.onnx"))), str(out / "slim.onnx"))
        quant_pre_process(str(out / "slim.onnx"), str(out / "pre.onnx"), skip_symbolic_shape=True)
    data = np.load(calib)["image"]
    feeds = iter([{"image": data[i : i + 1]} for i in range(len(data))])

    class Reader(q.CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    q.quantize_static(str(out / "pre.onnx"), str(out / "int8.onnx"), Reader(), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8, per_channel=True,
                      calibrate_method=q.CalibrationMethod.MinMax,
                      extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def edgekit_convert(model: Path, calib: Path, out: Path, with_eval: bool) -> None:
    from edgekit.pipeline import convert

    convert(model, "jetson", out / "build", precision="int8", calib=str(calib),
            eval_data=str(DIGITS / "eval.npz") if with_eval else None)


def help_time() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "edgekit", "--help"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-eval", action="store_true", help="skip edgekit's eval-accuracy step (raw path has none)")
    args = ap.parse_args()
    model, calib = DIGITS / "digits_cnn.pt2", DIGITS / "calib.npz"

    # warm-up: first imports of torch/onnxruntime are paid once by whichever runs first
    with tempfile.TemporaryDirectory() as d:
        raw_toolchain(model, calib, Path(d))
    raw_t, ek_t = [], []
    for i in range(args.repeats):
        order = [("raw", raw_t), ("edgekit", ek_t)] if i % 2 == 0 else [("edgekit", ek_t), ("raw", raw_t)]
        for name, bucket in order:
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                if name == "raw":
                    raw_toolchain(model, calib, Path(d))
                else:
                    edgekit_convert(model, calib, Path(d), not args.no_eval)
                bucket.append(time.perf_counter() - t0)
    raw_m, ek_m = statistics.median(raw_t), statistics.median(ek_t)
    helps = sorted(help_time() for _ in range(3))
    print(f"model: {model.relative_to(ROOT)}  (int8, calibration {len(np.load(calib)['image'])} samples)")
    print(f"raw toolchain   median {raw_m:.2f} s  runs {[round(t, 2) for t in raw_t]}")
    print(f"edgekit convert median {ek_m:.2f} s  runs {[round(t, 2) for t in ek_t]}"
          f"  ({'with' if not args.no_eval else 'without'} eval on 450 samples)")
    print(f"overhead ratio edgekit / raw: {ek_m / raw_m:.2f}x  (+{ek_m - raw_m:.2f} s for analysis, verification, bundle)")
    print(f"edgekit --help (fresh process, median of 3): {helps[1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
