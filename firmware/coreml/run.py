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
import os
import platform
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# edgekit_smoke.py (the shared smoke-test core) sits next to this file in a bundle and in
# ../common in the source tree
for _d in (HERE, os.path.join(os.path.dirname(HERE), "common")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
from edgekit_smoke import Smoke, golden_feeds, log, read_manifest  # noqa: E402
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


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


def load_runtime(bundle, manifest, compute_units):
    names = [o.get("runtime_name") or o["name"] for o in manifest["golden"]["outputs"]]
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

    bundle = os.path.abspath(args.bundle)
    try:
        manifest = read_manifest(bundle)
        manifest["golden"]["outputs"], manifest["artifact"]["primary"], manifest["tolerance"]
    except (OSError, ValueError, KeyError) as exc:
        log("cannot read manifest.json: %s" % exc)
        return 2

    smoke = Smoke(bundle, manifest, args.output or os.path.join(bundle, "smoke_result.json"))
    model = None
    if smoke.integrity():
        try:
            model = load(bundle, manifest, args.compute_units)
            smoke.loaded(model.name)
        except Exception as exc:  # report any runtime failure as a failed check
            smoke.add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if model is not None and args.compute_plan:
        try:
            smoke.result["compute_plan"] = compute_plan(os.path.join(bundle, manifest["artifact"]["primary"]),
                                                        args.compute_units, log)
        except Exception as exc:  # MLComputePlan needs macOS 14.4+
            log("compute plan unavailable: %s: %s" % (type(exc).__name__, exc))
    if model is not None:
        golden = np.load(os.path.join(bundle, manifest["golden"]["file"]))
        smoke.golden(model, golden)
        feed = golden_feeds(golden, manifest)[0]  # one run's inputs, each on its batch axis
        # this script never runs on the phone (the XCTest does): a Mac's latency, or a Linux host's
        # with an injected runtime, says nothing about the device's budget, so it is reported, not judged
        smoke.latency(lambda: model(feed), args.warmup, args.iters, judge=False, on_device=False,
                      note="measured on this host, not the device (%s); the device's budget (%s ms) is checked "
                      "by the XCTest on the device" % ("macOS" if sys.platform == "darwin" else platform.system(),
                                                      manifest.get("budgets", {}).get("latency_ms")))
        smoke.memory(judge=False, note=" (this process, on this machine)")
        smoke.power(why_not="no per-process power reading without sudo powermetrics")
    return smoke.finish(model is not None)


if __name__ == "__main__":
    sys.exit(main())
