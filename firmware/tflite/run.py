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
import hashlib
import json
import os
import platform
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_integrity(bundle, manifest):
    bad = []
    for rel, info in sorted(manifest.get("files", {}).items()):
        path = os.path.join(bundle, rel)
        if not os.path.isfile(path):
            bad.append("%s: missing" % rel)
        elif sha256_file(path) != info["sha256"]:
            bad.append("%s: sha256 differs from the manifest" % rel)
    return bad


def peak_rss_mb():
    # /proc VmHWM belongs to this process image; ru_maxrss survives exec and would report the
    # parent's peak when run from a big process (a test runner, an IDE)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 1024.0 if sys.platform != "darwin" else kb / (1024.0 * 1024.0)
    except Exception:
        return None


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


def compare(outputs, golden, manifest):
    tol = manifest["tolerance"]
    checks = []
    for spec, got in zip(manifest["golden"]["outputs"], outputs):
        ref = golden[spec["key"]].astype(np.float64)
        got = np.asarray(got, dtype=np.float64).reshape(ref.shape)
        err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        rel = err / scale if scale > 0 else err
        agree = None
        if ref.ndim == 2 and ref.shape[1] > 1:
            agree = float(np.mean(np.argmax(got, 1) == np.argmax(ref, 1)))
        ok = rel <= tol["max_rel_error"] and (agree is None or agree >= tol["min_top1_agreement"])
        checks.append({"output": spec["name"], "max_abs_error": err, "max_rel_error": rel,
                       "tolerance_rel": tol["max_rel_error"], "top1_agreement": agree, "passed": ok})
    return checks


def main(argv=None):
    ap = argparse.ArgumentParser(description="edgekit smoke test for a LiteRT (.tflite) bundle")
    ap.add_argument("--bundle", default=HERE, help="bundle folder (default: this script's folder)")
    ap.add_argument("--runtime", choices=["auto", "ai_edge_litert", "tflite_runtime", "tensorflow"], default="auto")
    ap.add_argument("--threads", type=int, default=None, help="interpreter threads (default: CPU count, max 4)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--output", default=None, help="smoke_result.json path (default: in the bundle)")
    args = ap.parse_args(argv)

    def log(msg):
        print("[edgekit-smoke] " + msg)
        sys.stdout.flush()

    bundle = os.path.abspath(args.bundle)
    out_path = args.output or os.path.join(bundle, "smoke_result.json")
    try:
        with open(os.path.join(bundle, "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as exc:
        log("cannot read manifest.json: %s" % exc)
        return 2
    threads = args.threads or min(4, os.cpu_count() or 1)
    result = {"bundle": manifest.get("name"), "board": manifest.get("board", {}).get("id"),
              "precision": manifest.get("precision"), "host": platform.node(), "machine": platform.machine(),
              "python": platform.python_version(), "threads": threads, "checks": [],
              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def add(name, passed, detail, **extra):
        item = {"name": name, "passed": passed, "detail": detail}
        item.update(extra)
        result["checks"].append(item)
        log("%s %s: %s" % ("PASS" if passed else ("FAIL" if passed is False else "----"), name, detail))

    bad = check_integrity(bundle, manifest)
    add("integrity", not bad, "; ".join(bad) if bad else "%d files match manifest sha256" % len(manifest["files"]))
    model = None
    if not bad:
        try:
            nhwc = manifest.get("artifact", {}).get("layout") == "nhwc"
            model = LiteRTModel(os.path.join(bundle, manifest["artifact"]["primary"]), threads, nhwc, args.runtime)
            add("load", True, model.name)
            result["runtime"] = model.name
        except Exception as exc:  # report any runtime failure as a failed check
            add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if model is not None:
        golden = np.load(os.path.join(bundle, manifest["golden"]["file"]))
        ins = manifest["golden"]["inputs"]
        n = manifest["golden"]["samples"]
        bs = ins[0]["shape"][0]
        outs = [model([golden[s["key"]][i:i + bs] for s in ins]) for i in range(0, n, bs)]
        merged = [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]
        per = compare(merged, golden, manifest)
        worst = max(per, key=lambda c: c["max_rel_error"])
        add("golden", all(c["passed"] for c in per),
            "%d samples; worst output %r max error %.3g (%.2f%% of range, tolerance %.2f%%)%s" % (
                n, worst["output"], worst["max_abs_error"], 100 * worst["max_rel_error"],
                100 * worst["tolerance_rel"],
                "" if worst["top1_agreement"] is None
                else ", top-1 agreement %.1f%%" % (100 * worst["top1_agreement"])),
            outputs=per)

        model.set_inputs([golden[s["key"]][0:bs] for s in ins])
        for _ in range(args.warmup):
            model.interp.invoke()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            model.interp.invoke()
            times.append((time.perf_counter() - t0) * 1000.0)
        lat = {"p50": float(np.percentile(times, 50)), "p90": float(np.percentile(times, 90)),
               "p99": float(np.percentile(times, 99)), "mean": float(np.mean(times)),
               "iters": len(times), "warmup": args.warmup}
        result["latency_ms"] = lat
        budget = manifest.get("budgets", {}).get("latency_ms")
        if budget:
            add("latency", lat["p90"] <= budget, "p50 %.3f / p90 %.3f / p99 %.3f ms; budget %.3g ms (on p90)" % (
                lat["p50"], lat["p90"], lat["p99"], budget), budget_ms=budget)
        else:
            add("latency", None, "p50 %.3f / p90 %.3f / p99 %.3f ms; no budget" % (lat["p50"], lat["p90"], lat["p99"]))
        rss = peak_rss_mb()
        result["peak_rss_mb"] = rss
        ram_budget = manifest.get("budgets", {}).get("ram_mb")
        if rss is not None and ram_budget:
            add("memory", rss <= ram_budget, "peak RSS %.1f MB; budget %.0f MB" % (rss, ram_budget),
                budget_mb=ram_budget)
        else:
            add("memory", None, "peak RSS %s MB" % ("%.1f" % rss if rss is not None else "unknown"))
        result["power_w"] = None
        add("power", None, "not measured: no power rails read by this runner")
    result["passed"] = all(c["passed"] is not False for c in result["checks"]) and model is not None
    result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, out_path)
    log("%s -> %s" % ("PASSED" if result["passed"] else "FAILED", out_path))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
