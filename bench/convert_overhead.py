"""edgekit convert --precision int8 vs the raw toolchain calls, side by side, with the build cache off.

Raw path = what a user would otherwise write. jetson: torch.export.load -> torch.onnx.export
(dynamo, opset 18) -> onnxslim -> onnxruntime quant_pre_process -> quantize_static (QDQ,
symmetric, per-channel, MinMax) on the same calibration data. android: torch.export.load ->
litert-torch's PT2E quantizer (prepare_pt2e, calibration, convert_pt2e) -> litert_torch.convert ->
.tflite. edgekit adds ingest checks, analysis (op-support + liveness), the observer choice, host
verification (golden + eval accuracy), for android the fp32 lowering and the speed comparison,
golden files, runner copy, manifest hashes, report, atomic output.

    python bench/convert_overhead.py [--target jetson|android] [--repeats 3] [--no-eval]

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


def raw_litert(model: Path, calib: Path, out: Path) -> None:
    import litert_torch
    import torch
    from litert_torch.quantize import pt2e_quantizer as pq
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e import quantize_pt2e

    ep = torch.export.load(str(model))
    q = pq.PT2EQuantizer().set_global(pq.get_symmetric_quantization_config(is_per_channel=True))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        prepared = quantize_pt2e.prepare_pt2e(ep.module(), q)
        data = np.load(calib)["image"]
        with torch.no_grad():
            for i in range(len(data)):
                prepared(torch.from_numpy(data[i : i + 1]))
        conv = quantize_pt2e.convert_pt2e(prepared, fold_quantize=False)
        edge = litert_torch.convert(conv, (torch.zeros(1, 1, 8, 8),), quant_config=QuantConfig(pt2e_quantizer=q))
        edge.export(str(out / "model.tflite"))


def edgekit_convert(model: Path, calib: Path, out: Path, with_eval: bool, target: str) -> None:
    from edgekit.pipeline import convert

    convert(model, target, out / "build", precision="int8", calib=str(calib),
            eval_data=str(DIGITS / "eval.npz") if with_eval else None, cache=False)


def help_time() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "edgekit", "--help"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target", choices=("jetson", "android"), default="jetson")
    ap.add_argument("--no-eval", action="store_true", help="skip edgekit's eval-accuracy step (raw path has none)")
    args = ap.parse_args()
    model, calib = DIGITS / "digits_cnn.pt2", DIGITS / "calib.npz"

    raw = raw_toolchain if args.target == "jetson" else raw_litert
    # warm-up: first imports of torch/onnxruntime are paid once by whichever runs first
    with tempfile.TemporaryDirectory() as d:
        raw(model, calib, Path(d))
    raw_t, ek_t = [], []
    for i in range(args.repeats):
        order = [("raw", raw_t), ("edgekit", ek_t)] if i % 2 == 0 else [("edgekit", ek_t), ("raw", raw_t)]
        for name, bucket in order:
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                if name == "raw":
                    raw(model, calib, Path(d))
                else:
                    edgekit_convert(model, calib, Path(d), not args.no_eval, args.target)
                bucket.append(time.perf_counter() - t0)
    raw_m, ek_m = statistics.median(raw_t), statistics.median(ek_t)
    helps = sorted(help_time() for _ in range(3))
    print(f"model: {model.relative_to(ROOT)}  ({args.target} int8, build cache off, calibration {len(np.load(calib)['image'])} samples)")
    print(f"raw toolchain   median {raw_m:.2f} s  runs {[round(t, 2) for t in raw_t]}")
    print(f"edgekit convert median {ek_m:.2f} s  runs {[round(t, 2) for t in ek_t]}"
          f"  ({'with' if not args.no_eval else 'without'} eval on 450 samples)")
    print(f"overhead ratio edgekit / raw: {ek_m / raw_m:.2f}x  (+{ek_m - raw_m:.2f} s for analysis, verification, bundle)")
    print(f"edgekit --help (fresh process, median of 3): {helps[1] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
