"""This machine's CPU, read off the machine: the ``host/host`` board's compute figures.

The host board is whatever machine edgekit runs on, and CI machines differ from run to run
(seen on this project: an AVX-512 + VNNI Zen 5 one day, an AVX2-only Zen 3 the next, with
3x less fp32 peak and no int8 dot-product instruction). A fixed peak in ``host.toml`` is
therefore wrong somewhere; :func:`detect` reads the CPU instead and
:func:`edgekit.profiles.load_board` fills the host board's ``peak_tops`` from it.

Peak = usable cores x clock x operations per clock, where operations per clock follow from
the SIMD extensions in ``/proc/cpuinfo`` (1 FMA = 2 ops):

============================  ====================  ====================================
extension                     fp32 ops / clk / core  source
============================  ====================  ====================================
AVX-512F, two 512-bit FMA     64                     Intel Xeon SP (2 FMA ports), AMD Zen 5
AVX-512F on Zen 4             32                     512-bit ops run as two 256-bit halves
AVX2 + FMA3                   32                     2 x 256-bit FMA (Haswell+, Zen 2/3)
AVX                           16                     no FMA
SSE2 / NEON (ASIMD)           8 / 16                 Arm cores: 2 x 128-bit FMA (A76, N1)
============================  ====================  ====================================

int8 ops per clock: 4x the fp32 rate with a dot-product instruction (AVX-512 VNNI,
AVX-VNNI, Arm SDOT: 4 int8 MACs per 32-bit lane), else 2x (AVX2 ``VPMADDUBSW`` pairs,
which onnxruntime avoids on such CPUs for accuracy, see firmware/tensorrt/run.py).
fp16 arithmetic runs at 2x fp32 only with AVX512-FP16 or Arm FP16 (``asimdhp``);
elsewhere fp16 models compute in fp32. Clock: ``cpufreq/cpuinfo_max_freq`` where the
kernel exposes it, else ``cpu MHz`` (in a VM, the nominal clock; turbo is not seen, and the
efficiency factors absorb it). Cores: the CPUs this process may run on (affinity), capped
by a cgroup CPU quota.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class HostCPU:
    model: str
    arch: str
    cores: int
    clock_mhz: float
    isa: str  # the widest SIMD extension used for the peak
    fp32_ops_per_clk: int
    int8_ops_per_clk: int
    fp16_ops_per_clk: int
    l2_kb: int  # per core
    l3_kb: int  # shared
    ram_mb: int

    def peak_tops(self) -> dict[str, float]:
        scale = self.cores * self.clock_mhz * 1e6 / 1e12
        return {"fp32": round(self.fp32_ops_per_clk * scale, 4), "fp16": round(self.fp16_ops_per_clk * scale, 4),
                "int8": round(self.int8_ops_per_clk * scale, 4)}

    def describe(self) -> str:
        from edgekit.units import fmt_mb

        p = self.peak_tops()
        return (f"{self.model} ({self.arch}, {self.isa}), {self.cores} core(s) at {self.clock_mhz:.0f} MHz: "
                f"peak fp32 {p['fp32']} / int8 {p['int8']} TOPS; L2 {fmt_mb(self.l2_kb / 1024, kilo=1024)}/core, "
                f"L3 {fmt_mb(self.l3_kb / 1024, kilo=1024)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"peak_tops": self.peak_tops()}


def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty where there is none: macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        k, _, v = line.partition(":")
        out.setdefault(k.strip(), v.strip())
    return out


def _cores() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    try:  # cgroup v2 quota: "max 100000" or "200000 100000"
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def _clock_mhz(info: dict[str, str]) -> float:
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e3
    except (OSError, ValueError):
        pass
    try:
        return float(info.get("cpu MHz", ""))
    except ValueError:
        return 2000.0  # unknown (Arm /proc/cpuinfo has no clock and no cpufreq): a nominal 2 GHz


def _cache_kb(level: int) -> int:
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((idx / "level").read_text()) == level and (idx / "type").read_text().strip() != "Instruction":
                size = (idx / "size").read_text().strip().upper()
                mult = 1024 if size.endswith("M") else 1
                return int(size.rstrip("KM")) * mult
        except (OSError, ValueError):
            continue
    return 0


def _ram_mb() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def from_flags(flags: set[str], arch: str, family: int | None = None) -> tuple[str, int, int, int]:
    """(isa, fp32, int8, fp16 ops per clock per core) from cpuinfo flags."""
    if arch in ("aarch64", "arm64"):
        fp32 = 16
        int8 = fp32 * (4 if "asimddp" in flags else 2)
        return "neon" + ("+dotprod" if "asimddp" in flags else ""), fp32, int8, fp32 * (2 if "asimdhp" in flags else 1)
    if "avx512f" in flags:
        isa, fp32 = "avx512", 32 if family == 25 else 64  # AMD family 25 with AVX-512 = Zen 4 (double-pumped)
    elif "avx2" in flags and "fma" in flags:
        isa, fp32 = "avx2+fma", 32
    elif "avx" in flags:
        isa, fp32 = "avx", 16
    else:
        isa, fp32 = "sse2", 8
    vnni = bool({"avx512_vnni", "avx_vnni"} & flags)
    fp16 = fp32 * (2 if "avx512_fp16" in flags else 1)
    return isa + ("+vnni" if vnni else ""), fp32, fp32 * (4 if vnni else 2), fp16


@cache
def detect() -> HostCPU | None:
    """This machine's CPU, or None where /proc/cpuinfo cannot be read (macOS, Windows)."""
    info = _cpuinfo()
    if not info:
        return None
    arch = platform.machine().lower()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    try:
        family = int(info.get("cpu family", ""))
    except ValueError:
        family = None
    isa, fp32, int8, fp16 = from_flags(flags, arch, family)
    return HostCPU(model=info.get("model name") or platform.processor() or arch, arch=arch, cores=_cores(),
                   clock_mhz=_clock_mhz(info), isa=isa, fp32_ops_per_clk=fp32, int8_ops_per_clk=int8,
                   fp16_ops_per_clk=fp16, l2_kb=_cache_kb(2), l3_kb=_cache_kb(3), ram_mb=_ram_mb())
