#!/usr/bin/env python3
"""edgekit smoke runner for iOS bundles (Core ML ``.mlpackage``), run on a Mac.

Core ML runs only on Apple platforms: this script needs macOS with ``pip3 install
coremltools numpy``. On the phone itself the same checks run as the XCTest in
``EdgekitModelTests.swift`` (see README.md).

    python3 run.py                          # compute units ALL (CPU + GPU + Neural Engine)
    python3 run.py --compute-units CPU_AND_NE
    python3 run.py --compute-plan           # also print which device Core ML picks per op (macOS 14.4+)

Steps: integrity (sha256 of every file in manifest.json) -> load -> golden outputs within
the manifest's tolerances -> latency p50/p90/p99 after warm-up -> peak memory -> power
("not measured": macOS gives no per-process power without sudo powermetrics) ->
smoke_result.json (same schema as the other edgekit runners).
Exit code 0 when every check passes, 1 when one fails, 2 when the bundle is unusable.
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
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


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


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q))


def peak_rss_mb():
    try:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0  # bytes on macOS, KiB on Linux
    except Exception:
        return None


class CoreMLModel(object):
    """Core ML predict through coremltools (macOS only)."""

    def __init__(self, package, output_names, compute_units="ALL"):
        if sys.platform != "darwin":
            raise RuntimeError("Core ML runs only on macOS/iOS (this is %s): run this on a Mac, or the XCTest "
                               "on a device (README.md)" % platform.system())
        import coremltools as ct

        self.model = ct.models.MLModel(package, compute_units=getattr(ct.ComputeUnit, compute_units))
        self.output_names = output_names
        self.name = "Core ML (coremltools %s, macOS %s, compute units %s)" % (
            ct.__version__, platform.mac_ver()[0], compute_units)

    def __call__(self, feeds):
        out = self.model.predict({k: np.asarray(v, dtype=np.float32) for k, v in feeds.items()})
        return [np.asarray(out[n]) for n in self.output_names]


def compute_plan(package, compute_units, log):
    """Per-op device chosen by Core ML (MLComputePlan, macOS 14.4+ / coremltools 8+)."""
    import coremltools as ct
    from coremltools.models.compute_plan import MLComputePlan

    compiled = ct.utils.compile_model(package)
    plan = MLComputePlan.load_from_path(path=compiled, compute_units=getattr(ct.ComputeUnit, compute_units))
    counts = {}
    program = plan.model_structure.program
    for fn in program.functions.values():
        for op in fn.block.operations:
            usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
            dev = type(usage.preferred_compute_device).__name__ if usage else "const"
            counts[dev] = counts.get(dev, 0) + 1
    log("compute plan: %s" % ", ".join("%s %d ops" % kv for kv in sorted(counts.items())))
    return counts


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


def load_runtime(bundle, manifest, compute_units):
    names = [o["name"] for o in manifest["golden"]["outputs"]]
    return CoreMLModel(os.path.join(bundle, manifest["artifact"]["primary"]), names, compute_units)


def main(argv=None, load=load_runtime):
    ap = argparse.ArgumentParser(description="edgekit smoke test for an iOS (Core ML) bundle, on a Mac")
    ap.add_argument("--bundle", default=HERE, help="bundle folder (default: this script's folder)")
    ap.add_argument("--compute-units", choices=COMPUTE_UNITS, default="ALL")
    ap.add_argument("--compute-plan", action="store_true", help="print the device Core ML picks per op")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--output", default=None, help="smoke_result.json path (default: in the bundle)")
    args = ap.parse_args(argv)

    def log(msg):
        print("[edgekit-smoke] " + msg, flush=True)

    bundle = os.path.abspath(args.bundle)
    out_path = args.output or os.path.join(bundle, "smoke_result.json")
    try:
        with open(os.path.join(bundle, "manifest.json")) as f:
            manifest = json.load(f)
        manifest["golden"]["outputs"], manifest["artifact"]["primary"], manifest["tolerance"]
    except (OSError, ValueError, KeyError) as exc:
        log("cannot read manifest.json: %s" % exc)
        return 2

    result = {"bundle": manifest.get("name"), "board": manifest.get("board", {}).get("id"),
              "precision": manifest.get("precision"), "host": platform.node(), "machine": platform.machine(),
              "python": platform.python_version(), "checks": [],
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
            model = load(bundle, manifest, args.compute_units)
            add("load", True, model.name)
            result["runtime"] = model.name
        except Exception as exc:  # report any runtime failure as a failed check
            add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if model is not None and args.compute_plan:
        try:
            result["compute_plan"] = compute_plan(os.path.join(bundle, manifest["artifact"]["primary"]),
                                                  args.compute_units, log)
        except Exception as exc:  # MLComputePlan needs macOS 14.4+
            log("compute plan unavailable: %s: %s" % (type(exc).__name__, exc))
    if model is not None:
        golden = np.load(os.path.join(bundle, manifest["golden"]["file"]))
        ins = manifest["golden"]["inputs"]
        n = manifest["golden"]["samples"]
        bs = ins[0]["shape"][0]
        outs = [model({s["name"]: golden[s["key"]][i:i + bs] for s in ins}) for i in range(0, n, bs)]
        merged = [np.concatenate([np.asarray(o[k]).reshape((-1,) + np.asarray(o[k]).shape[1:]) for o in outs])
                  for k in range(len(outs[0]))]
        per = compare(merged, golden, manifest)
        worst = max(per, key=lambda c: c["max_rel_error"])
        add("golden", all(c["passed"] for c in per),
            "%d samples; worst output %r max error %.3g (%.2f%% of range, tolerance %.2f%%)%s" % (
                n, worst["output"], worst["max_abs_error"], 100 * worst["max_rel_error"],
                100 * worst["tolerance_rel"],
                "" if worst["top1_agreement"] is None else ", top-1 agreement %.1f%%" % (100 * worst["top1_agreement"])),
            outputs=per)
        feed = {s["name"]: golden[s["key"]][0:bs] for s in ins}
        for _ in range(args.warmup):
            model(feed)
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            model(feed)
            times.append((time.perf_counter() - t0) * 1000.0)
        lat = {"p50": percentile(times, 50), "p90": percentile(times, 90), "p99": percentile(times, 99),
               "mean": float(np.mean(times)), "iters": len(times), "warmup": args.warmup}
        result["latency_ms"] = lat
        budget = manifest.get("budgets", {}).get("latency_ms")
        detail = "p50 %.3f / p90 %.3f / p99 %.3f ms" % (lat["p50"], lat["p90"], lat["p99"])
        if sys.platform == "darwin":
            # a Mac is not the phone: its latency says nothing about the board's budget
            add("latency", None, detail + " on this Mac; the board budget (%s ms) is checked by the XCTest on the "
                "device" % budget)
        elif budget:
            add("latency", lat["p90"] <= budget, detail + "; budget %.3g ms (on p90)" % budget, budget_ms=budget)
        else:
            add("latency", None, detail + "; no budget")
        rss = peak_rss_mb()
        result["peak_rss_mb"] = rss
        add("memory", None, "peak RSS %s MB (this process, on this machine)" % (
            "%.1f" % rss if rss is not None else "unknown"))
        result["power_w"] = None
        add("power", None, "not measured: no per-process power reading without sudo powermetrics")
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
