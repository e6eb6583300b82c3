"""`edgekit matrix` wall time: one process at a time, the process pool, and Ray tasks on a local cluster, side by
side in one run on the same spec (the digits CNN and MLP × two Jetson boards × fp32 and int8: 8 cells), each run
with its own empty data folder (results store, build cache), so no run reuses another's builds.

    python bench/matrix.py [--jobs 2] [--no-ray]

Prints each runner's wall time and its ratio to one-at-a-time; then a second run of the pool on an unchanged spec
(what a re-run costs when nothing changed: with the build cache, no cell rebuilds).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = f"""
precisions = ["fp32", "int8"]
target = "jetson"
boards = ["host", "nvidia/jetson-orin-nano-8gb"]

[[models]]
name = "cnn"
path = "{ROOT}/examples/digits/digits_cnn.pt2"
calib = "{ROOT}/examples/digits/calib.npz"
eval = "{ROOT}/examples/digits/eval.npz"

[[models]]
name = "mlp"
path = "{ROOT}/examples/digits_fpga/digits_mlp.pt2"
calib = "{ROOT}/examples/digits/calib.npz"
eval = "{ROOT}/examples/digits/eval.npz"
"""


def timed(spec: Path, out: Path, **kw) -> tuple[float, dict]:
    from edgekit import matrix

    t0 = time.perf_counter()
    res = matrix.run(spec, out, **kw)
    return time.perf_counter() - t0, res["totals"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgekit-bench-matrix-"))
    spec = work / "matrix.toml"
    spec.write_text(SPEC)
    rows = []

    def fresh(name: str) -> Path:
        os.environ["EDGEKIT_DATA_DIR"] = str(work / f"data-{name}")  # own results store and build cache
        os.environ.pop("EDGEKIT_RESULTS_DB", None)
        return work / f"out-{name}"

    rows.append(("one at a time (--jobs 1)", *timed(spec, fresh("serial"), jobs=1)))
    pool_out = fresh("pool")
    rows.append((f"process pool (--jobs {args.jobs})", *timed(spec, pool_out, jobs=args.jobs)))
    rows.append(("process pool, re-run unchanged", *timed(spec, pool_out, jobs=args.jobs)))
    if not args.no_ray:
        import ray

        out = fresh("ray")
        t0 = time.perf_counter()
        ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False)
        start = time.perf_counter() - t0
        rows.append((f"Ray, local cluster of {args.jobs} CPUs", *timed(spec, out, ray="auto")))
        ray.shutdown()
        print(f"(Ray cluster start: {start:.1f} s, not counted)")
    base = rows[0][1]
    print(f"{'runner':36} {'wall s':>8} {'× serial':>9}  cells")
    for name, wall, tot in rows:
        print(f"{name:36} {wall:8.1f} {wall / base:9.2f}  " + ", ".join(f"{k} {v}" for k, v in tot.items() if v))
    print(f"cores: {os.cpu_count()}; outputs in {work}")


if __name__ == "__main__":
    main()
