#!/usr/bin/env python3
"""edgekit on-board smoke test for FPGA bundles (PYNQ overlay).

    ./build.sh                 # where Vivado is installed: writes overlay.bit + overlay.hwh
    python3 smoke.py           # on the board (PYNQ image), as root (sudo) for /dev/mem

Steps: integrity (sha256 of every file in manifest.json) -> load the overlay (pynq Overlay,
AXI DMA buffers) -> golden vectors from fabric_golden.npz (inputs already on the input
quantizer's grid; outputs from QONNX execution, which the host's C simulation matched bit
for bit) must come back EXACTLY -> latency p50/p90/p99 of the DMA round trip -> memory ->
power (not exposed on PYNQ boards) -> smoke_result.json (same schema as the Jetson runner).
Exit 0 when every check passes, 1 when one fails, 2 when the bundle is unusable.
Needs only numpy and pynq (both on the PYNQ image). Python 3.6 syntax.
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
BITFILE = "overlay.bit"


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

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    except Exception:
        return None


def load_driver(bundle, golden):
    sys.path.insert(0, bundle)
    from fabric_driver import FabricDriver

    return FabricDriver(os.path.join(bundle, BITFILE), golden["input"].shape[1], golden["output"].shape[1])


def main(argv=None, driver=None):
    """``driver``: an object with ``infer(x) -> y`` and ``name`` (tests pass a host stand-in)."""
    ap = argparse.ArgumentParser(description="edgekit smoke test for an FPGA (PYNQ) bundle")
    ap.add_argument("--bundle", default=HERE, help="bundle folder (default: this script's folder)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--output", default=None, help="smoke_result.json path (default: in the bundle)")
    args = ap.parse_args(argv)

    def log(msg):
        print("[edgekit-smoke] " + msg, flush=True)

    bundle = os.path.abspath(args.bundle)
    out_path = args.output or os.path.join(bundle, "smoke_result.json")
    try:
        with open(os.path.join(bundle, "manifest.json")) as f:
            manifest = json.load(f)
        golden = np.load(os.path.join(bundle, manifest["artifact"]["fabric_golden"]))
    except (OSError, ValueError, KeyError) as exc:
        log("cannot read manifest.json / fabric golden vectors: %s" % exc)
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
    if not bad and driver is None:
        try:
            driver = load_driver(bundle, golden)
        except Exception as exc:  # no pynq, no bitstream, no device: a failed check, reported
            add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if driver is not None and not bad:
        add("load", True, driver.name)
        result["runtime"] = driver.name
        xs, ys = golden["input"], golden["output"]
        got = np.stack([np.asarray(driver.infer(x), np.float32).reshape(-1) for x in xs])
        exact = np.all(got == ys.reshape(got.shape), axis=1)
        diff = float(np.max(np.abs(got - ys.reshape(got.shape))))
        add("golden", bool(exact.all()), "%d/%d golden vectors bit-exact (max |diff| %.6g)" % (
            int(exact.sum()), len(xs), diff), bit_exact=int(exact.sum()), samples=len(xs))
        for _ in range(args.warmup):
            driver.infer(xs[0])
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            driver.infer(xs[0])
            times.append((time.perf_counter() - t0) * 1000.0)
        lat = {"p50": percentile(times, 50), "p90": percentile(times, 90), "p99": percentile(times, 99),
               "mean": float(np.mean(times)), "iters": len(times), "warmup": args.warmup}
        result["latency_ms"] = lat
        budget = manifest.get("budgets", {}).get("latency_ms")
        add("latency", lat["p90"] <= budget if budget else None,
            "DMA round trip p50 %.3f / p90 %.3f / p99 %.3f ms; budget %s ms (on p90)" % (
                lat["p50"], lat["p90"], lat["p99"], budget), budget_ms=budget)
        rss = peak_rss_mb()
        result["peak_rss_mb"] = rss
        ram_budget = manifest.get("budgets", {}).get("ram_mb")
        add("memory", (rss <= ram_budget) if (rss is not None and ram_budget) else None,
            "peak RSS %s MB; budget %s MB" % ("%.1f" % rss if rss is not None else "unknown", ram_budget))
        result["power_w"] = None
        add("power", None, "not measured: PYNQ boards expose no power rails to software")
    result["passed"] = all(c["passed"] is not False for c in result["checks"]) and driver is not None and not bad
    result["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, out_path)
    log("%s -> %s" % ("PASSED" if result["passed"] else "FAILED", out_path))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
