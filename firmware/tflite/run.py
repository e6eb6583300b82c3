#!/usr/bin/env python3
"""edgekit device runner for LiteRT (.tflite) bundles, on any Linux board (Raspberry Pi, Jetson
CPU, an Android shell with Python, x86 hosts).

Needs numpy and one LiteRT runtime: ``ai_edge_litert`` (pip install ai-edge-litert), else
``tflite_runtime`` (older boards; needs numpy < 2), else ``tensorflow.lite``. Python 3.6 syntax.

    python3 run.py                  # integrity -> load -> golden -> latency -> smoke_result.json
    python3 run.py --threads 4 --iters 200

Exit code 0 when every check passes, 1 when one fails, 2 when the bundle is unusable.
On Android phones without Python use push_and_bench.sh (adb + benchmark_model).
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# edgekit_smoke.py (the shared smoke-test core) sits next to this file in a bundle and in
# ../common in the source tree
for _d in (HERE, os.path.join(os.path.dirname(HERE), "common")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
from edgekit_smoke import Smoke, golden_feeds, log, read_manifest  # noqa: E402


def import_interpreter(prefer="auto"):
    """(Interpreter class, runtime name): ai_edge_litert, else tflite_runtime, else tensorflow.lite."""
    order = ["ai_edge_litert", "tflite_runtime", "tensorflow"] if prefer == "auto" else [prefer]
    errors = []
    for name in order:
        try:
            if name == "ai_edge_litert":
                from ai_edge_litert.interpreter import Interpreter
                import ai_edge_litert as mod
            elif name == "tflite_runtime":
                from tflite_runtime.interpreter import Interpreter
                import tflite_runtime as mod
            else:
                import tensorflow as mod
                Interpreter = mod.lite.Interpreter
            return Interpreter, "%s %s" % (name, getattr(mod, "__version__", "?"))
        except Exception as exc:  # ImportError, or a numpy ABI mismatch
            errors.append("%s: %s" % (name, exc))
    raise RuntimeError("no LiteRT runtime imports here (%s); pip3 install ai-edge-litert" % "; ".join(errors))


def quantize(x, detail):
    dt = np.dtype(detail["dtype"])
    scale, zp = detail["quantization"]
    if dt.kind == "f" or not scale:
        return np.ascontiguousarray(x, dtype=dt)
    info = np.iinfo(dt)
    return np.clip(np.round(x / scale) + zp, info.min, info.max).astype(dt)


def dequantize(y, detail):
    scale, zp = detail["quantization"]
    if np.dtype(detail["dtype"]).kind == "f" or not scale:
        return np.asarray(y, dtype=np.float32).copy()
    return ((y.astype(np.float32) - zp) * scale).astype(np.float32)


class LiteRTModel(object):
    """Float feeds in (NCHW as the torch model), float outputs back: quantizes int8 inputs and
    dequantizes int8 outputs with the tensors' scale and zero point; transposes for NHWC models."""

    def __init__(self, path, threads, nhwc, prefer="auto"):
        Interpreter, self.name = import_interpreter(prefer)
        self.interp = Interpreter(model_path=path, num_threads=threads)
        self.interp.allocate_tensors()
        self.ins = self.interp.get_input_details()
        self.outs = self.interp.get_output_details()
        self.nhwc = nhwc
        self.name += " (%d threads)" % threads

    def set_inputs(self, feeds_in_order):
        for x, d in zip(feeds_in_order, self.ins):
            x = np.asarray(x, dtype=np.float32)
            if self.nhwc and x.ndim == 4:
                x = x.transpose(0, 2, 3, 1)
            self.interp.set_tensor(d["index"], quantize(x, d))

    def outputs(self):
        res = []
        for d in self.outs:
            y = dequantize(self.interp.get_tensor(d["index"]), d)
            if self.nhwc and y.ndim == 4:
                y = y.transpose(0, 3, 1, 2)
            res.append(y)
        return res

    def __call__(self, feeds_in_order):
        self.set_inputs(feeds_in_order)
        self.interp.invoke()
        return self.outputs()


def main(argv=None):
    ap = argparse.ArgumentParser(description="edgekit smoke test for a LiteRT (.tflite) bundle")
    ap.add_argument("--bundle", default=HERE, help="bundle folder (default: this script's folder)")
    ap.add_argument("--runtime", choices=["auto", "ai_edge_litert", "tflite_runtime", "tensorflow"], default="auto")
    ap.add_argument("--threads", type=int, default=None, help="interpreter threads (default: CPU count, max 4)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--output", default=None, help="smoke_result.json path (default: in the bundle)")
    args = ap.parse_args(argv)

    bundle = os.path.abspath(args.bundle)
    try:
        manifest = read_manifest(bundle)
    except (OSError, ValueError) as exc:
        log("cannot read manifest.json: %s" % exc)
        return 2
    threads = args.threads or min(4, os.cpu_count() or 1)
    smoke = Smoke(bundle, manifest, args.output or os.path.join(bundle, "smoke_result.json"), threads=threads)
    model = None
    if smoke.integrity():
        try:
            nhwc = manifest.get("artifact", {}).get("layout") == "nhwc"
            model = LiteRTModel(os.path.join(bundle, manifest["artifact"]["primary"]), threads, nhwc, args.runtime)
            smoke.loaded(model.name)
        except Exception as exc:  # report any runtime failure as a failed check
            smoke.add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if model is not None:
        golden = np.load(os.path.join(bundle, manifest["golden"]["file"]))
        ins = manifest["golden"]["inputs"]
        smoke.golden(lambda feed: model([feed[s["name"]] for s in ins]), golden)
        first = golden_feeds(golden, manifest)[0]  # one run's inputs, each on its batch axis
        model.set_inputs([first[s.get("runtime_name") or s["name"]] for s in ins])
        smoke.latency(model.interp.invoke, args.warmup, args.iters)  # the interpreter alone, inputs set once
        smoke.memory()
        smoke.power(why_not="no power rails read by this runner")
    return smoke.finish(model is not None)


if __name__ == "__main__":
    sys.exit(main())
