"""The build cache, measured: a cold and a warm `edgekit convert` of the digits example side by side, and what the
cached float export + analysis saves a second precision of the same model.

    python bench/cache.py [--target jetson] [--precision int8] [--repeats 5]

Every convert is a fresh `edgekit` process (what a user or a CI job runs), with an empty cache and data folder of
its own. Wall time depends on the machine's load; CPU time (user + sys of the process) much less, so both are
printed. The issue's bar: a warm convert of an unchanged build under 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"


def run(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, cpu s, stderr) of one `edgekit` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"edgekit {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="jetson")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--second", default="fp32", help="the other precision: its build reuses the cached analysis")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "EDGEKIT_DATA_DIR": str(tmp / "data"), "EDGEKIT_CACHE_DIR": str(tmp / "cache"),
               "COLUMNS": "200"}
        common = [str(DIGITS / "digits_cnn.pt2"), "--target", a.target, "--calib", str(DIGITS / "calib.npz"),
                  "--eval", str(DIGITS / "eval.npz")]

        def convert(precision: str, out: str, *extra: str) -> tuple[float, float, str]:
            return run(["convert", *common, "-p", precision, "-o", str(tmp / out), *extra], env)

        cold_wall, cold_cpu, _ = convert(a.precision, "cold")
        warm = [convert(a.precision, "warm") for _ in range(a.repeats)]
        assert all("cache hit" in w[2] for w in warm), warm[0][2]
        warm_wall = statistics.median(w[0] for w in warm)
        warm_cpu = statistics.median(w[1] for w in warm)
        print(f"digits, {a.target} {a.precision}: cold convert (empty cache) vs warm convert (cache hit), "
              f"{a.repeats} warm runs (median)")
        print(f"  {'':<6} {'wall s':>8} {'cpu s':>8}")
        print(f"  {'cold':<6} {cold_wall:8.2f} {cold_cpu:8.2f}")
        print(f"  {'warm':<6} {warm_wall:8.2f} {warm_cpu:8.2f}   (min wall {min(w[0] for w in warm):.2f} s)")
        print(f"  cold / warm: {cold_wall / warm_wall:.0f}x wall, {cold_cpu / warm_cpu:.0f}x cpu; "
              f"warm under 0.5 s: wall {'yes' if warm_wall < 0.5 else 'NO'}, cpu {'yes' if warm_cpu < 0.5 else 'NO'}")

        # a second precision: the cache holds the float export + analysis (not this build), vs no cache at all
        nocache_wall, nocache_cpu, _ = convert(a.second, "second-nocache", "--no-cache")
        reuse_wall, reuse_cpu, reuse_err = convert(a.second, "second-cached")
        assert "cache hit" not in reuse_err
        t_no = json.loads((tmp / "second-nocache" / "manifest.json").read_text())["timings_s"]
        t_re = json.loads((tmp / "second-cached" / "manifest.json").read_text())["timings_s"]
        print(f"\nsecond precision ({a.second}) of the same model: analysis cached vs --no-cache")
        print(f"  analyze stage: {t_no['analyze']:.2f} s -> {t_re['analyze']:.2f} s "
              f"(saves {t_no['analyze'] - t_re['analyze']:.2f} s)")
        print("  every stage (s): " + ", ".join(f"{k} {t_no[k]:.2f} -> {t_re.get(k, 0):.2f}" for k in t_no))
        print(f"  whole convert: wall {nocache_wall:.2f} s -> {reuse_wall:.2f} s (saves {nocache_wall - reuse_wall:.2f} s), "
              f"cpu {nocache_cpu:.2f} s -> {reuse_cpu:.2f} s (saves {nocache_cpu - reuse_cpu:.2f} s)")


if __name__ == "__main__":
    main()
