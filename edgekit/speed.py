"""The artifact's speed in the verdict. INT8 exists for speed on the board, so an INT8 build is timed on the
target's host runtime next to the same model's float build (the converter's ``host_speed``, a capability the
registry declares: ``ConverterInfo.speed``), both reported, and an INT8 build that runs slower than its float
build fails verification unless the user accepts it (``allow_slower_int8``) or the timing on this host does not
stand for the board's kernels (``Speed.judged``: a board whose NPU runs 16-bit activations natively).

Timings are medians of interleaved runs in one process (the float and INT8 interpreters take turns, so a busy
host slows both alike). A difference under :data:`MARGIN` (relative) or :data:`MIN_DIFF_MS` (absolute) is
within what such timings tell apart on a shared CPU, or the QUANTIZE / DEQUANTIZE at a tiny model's edges, and is
not called slower. Past both, a build is slower when the pairs agree: in at least :data:`CONSISTENT` of the
interleaved pairs it ran longer than its float build (a stall in a few runs does not move the verdict)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

MARGIN = 0.10  # INT8 more than 10 % slower than float is slower; closer is timing noise on a shared 2-core host
MIN_DIFF_MS = 0.02  # under 20 µs apart: launch overhead and the edges' QUANTIZE / DEQUANTIZE, not the kernels
CONSISTENT = 0.75  # share of interleaved pairs in which the build ran longer: past it, a slower median is real
ROUND_BUDGET_S = 3.0  # wall time the interleaved timing may take per pair of models


@dataclass
class Speed:
    """Host latency of a build and of the same model's float build, on one runtime."""

    runtime: str  # e.g. "LiteRT 2.1 (XNNPACK, 1 thread)"
    float_ms: float
    ms: float
    runs: int  # timed runs of each model
    kernels: str  # which kernels the build's ops run on, in words (e.g. "int8 XNNPACK: 40 ops; float: 2 ops")
    judged: bool = True  # False: this host's timing does not stand for the board (see ``not_judged``)
    not_judged: str = ""
    float_precision: str = "fp32"  # the float build compared against (jetson: the fp16 engine)
    estimated: bool = False  # the cost model's figures for the board's kernels, not a timing (``runs`` is 0)
    pairs_slower: float | None = None  # share of the interleaved pairs in which the build ran longer than float

    @property
    def speedup(self) -> float:
        """float time / build time: above 1 the build is faster."""
        return self.float_ms / self.ms if self.ms > 0 else float("inf")

    @property
    def slower(self) -> bool:
        if self.ms <= self.float_ms * (1 + MARGIN) or self.ms - self.float_ms <= MIN_DIFF_MS:
            return False
        return self.pairs_slower is None or self.pairs_slower >= CONSISTENT

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "speedup": round(self.speedup, 3), "slower": self.slower}

    def line(self, precision: str) -> str:
        """One line for the CLI, the notes and the report."""
        if self.slower:
            how = f"{1 / self.speedup:.2f}x slower than"
        elif self.ms < self.float_ms * (1 - MARGIN):
            how = f"{self.speedup:.2f}x faster than"
        else:
            how = "as fast as (within timing noise)"
        how_known = "estimated, not timed" if self.estimated else f"median of {self.runs} interleaved runs"
        return (f"speed on {self.runtime}: {precision} {self.ms:.4g} ms, {how} the {self.float_precision} build's "
                f"{self.float_ms:.4g} ms ({how_known}); {self.kernels}")


def interleaved(run_float: Callable[[], None], run_build: Callable[[], None], budget_s: float = ROUND_BUDGET_S,
                max_runs: int = 1000) -> tuple[float, float, int, float]:
    """Median ms of ``run_float`` and ``run_build``, timed in turns (a warm-up of each first); as many runs as fit
    ``budget_s`` (at least 5, at most ``max_runs``). Returns (float ms, build ms, runs of each, the share of pairs in
    which the build ran longer)."""
    for f in (run_float, run_build, run_float, run_build):
        f()
    t0 = time.perf_counter()
    run_float()
    run_build()
    pair = max(time.perf_counter() - t0, 1e-6)
    runs = int(min(max_runs, max(5, budget_s / pair)))
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):
        for f, out in ((run_float, a), (run_build, b)):
            t = time.perf_counter()
            f()
            out.append((time.perf_counter() - t) * 1000)
    return statistics.median(a), statistics.median(b), runs, sum(y > x for x, y in zip(a, b)) / runs


def verdict(speed: Speed, precision: str, allowed: bool) -> str | None:
    """The verification failure a slower INT8 build records; None where it is not slower, not judged here, or the
    user accepted it."""
    if precision != "int8" or not speed.judged or not speed.slower or allowed:
        return None
    return (f"speed: the INT8 build runs {1 / speed.speedup:.2f}x slower than the {speed.float_precision} build on "
            f"{speed.runtime} "
            f"({speed.ms:.4g} ms against {speed.float_ms:.4g} ms; {speed.kernels}): INT8 is for speed on the board, "
            "and this one costs time; ship the fp32 (or fp16) build, or pass --allow-slower-int8 to accept it")
