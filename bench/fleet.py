"""A fleet smoke test, measured: three boards at once vs one board, on real OpenSSH servers on loopback.

    python bench/fleet.py [--repeats 3]

This machine plays every board (the digits bundle, jetson target for the host board, onnxruntime runner), so the
three smoke runs share its CPU cores: the ratio shows what running them concurrently buys over one after the
other (3x one board's time). Prints the median wall time of each, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import os

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        tmp = Path(tmp)
        os.environ.setdefault("EDGEKIT_DATA_DIR", str(tmp / "data"))
        os.environ.setdefault("EDGEKIT_CACHE_DIR", str(tmp / "cache"))
        from flash_support import Sshd, digits_bundle

        from edgekit.bundle import unpack
        from edgekit.fleet import Fleet, FleetBoard, run_fleet

        servers = []
        for i in range(3):
            (tmp / f"sshd{i}").mkdir()
            servers.append(Sshd(tmp / f"sshd{i}"))
            servers[-1].start()
        try:
            boards = [FleetBoard(name=f"b{i}", board="host/host", address=s.address, key=str(s.user_key),
                                 known_hosts=str(s.known_hosts), dest=str(tmp / f"board{i}" / "digits"),
                                 python=sys.executable, tags=["all"] + (["one"] if i == 0 else []))
                      for i, s in enumerate(servers)]
            fleet = Fleet(boards=boards)
            with unpack(digits_bundle()) as ub:
                flashed = run_fleet("flash", [ub], fleet, max_parallel=3)
                assert all(o.passed for o in flashed), [o.reason for o in flashed]
                times: dict[str, list[float]] = {"one": [], "all": []}
                for _ in range(a.repeats):
                    for tag in ("one", "all"):  # alternating: neither side gets the warmer machine
                        t0 = time.perf_counter()
                        outs = run_fleet("smoke", [ub], fleet, tags=[tag], max_parallel=3)
                        times[tag].append(time.perf_counter() - t0)
                        assert all(o.passed for o in outs), [o.reason for o in outs]
        finally:
            for s in servers:
                s.stop()
    one, three = statistics.median(times["one"]), statistics.median(times["all"])
    print(f"fleet smoke of the digits bundle over ssh on loopback, {a.repeats} runs each (median wall s), "
          f"{os.cpu_count()} CPU cores")
    print(f"  1 board:  {one:.2f} s")
    print(f"  3 boards: {three:.2f} s  = {three / one:.2f}x one board (3 boards one after the other: 3.00x)")


if __name__ == "__main__":
    main()
