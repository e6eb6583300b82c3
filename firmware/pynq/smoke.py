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
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# edgekit_smoke.py (the shared smoke-test core) sits next to this file in a bundle and in
# ../common in the source tree
for _d in (HERE, os.path.join(os.path.dirname(HERE), "common")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
from edgekit_smoke import Smoke, log, read_manifest  # noqa: E402

BITFILE = "overlay.bit"


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

    bundle = os.path.abspath(args.bundle)
    try:
        manifest = read_manifest(bundle)
        golden = np.load(os.path.join(bundle, manifest["artifact"]["fabric_golden"]))
    except (OSError, ValueError, KeyError) as exc:
        log("cannot read manifest.json / fabric golden vectors: %s" % exc)
        return 2

    smoke = Smoke(bundle, manifest, args.output or os.path.join(bundle, "smoke_result.json"))
    intact = smoke.integrity()
    if intact and driver is None:
        try:
            driver = load_driver(bundle, golden)
        except Exception as exc:  # no pynq, no bitstream, no device: a failed check, reported
            smoke.add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if driver is not None and intact:
        smoke.loaded(driver.name)
        xs, ys = golden["input"], golden["output"]
        got = np.stack([np.asarray(driver.infer(x), np.float32).reshape(-1) for x in xs])
        exact = np.all(got == ys.reshape(got.shape), axis=1)
        diff = float(np.max(np.abs(got - ys.reshape(got.shape))))
        smoke.add("golden", bool(exact.all()), "%d/%d golden vectors bit-exact (max |diff| %.6g)" % (
            int(exact.sum()), len(xs), diff), bit_exact=int(exact.sum()), samples=len(xs))
        smoke.latency(lambda: driver.infer(xs[0]), args.warmup, args.iters, label="DMA round trip ")
        smoke.memory()
        smoke.power(why_not="PYNQ boards expose no power rails to software")
    return smoke.finish(driver is not None and intact)


if __name__ == "__main__":
    sys.exit(main())
