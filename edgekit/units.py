"""The one size format of edgekit's CLI, reports and plots.

A size reads in the unit that keeps it short: ``"6,326.3 MB"``, ``"65.7 KB"``, ``"512 B"``, ``"131.1 GB"`` — at
most one decimal (more only where a caller asks, to tell two close figures apart), a trailing ``.0`` dropped,
thousands separators. MB stays the unit from 1 MB up to 100,000 MB, as the budget flags (``--max-ram-mb``) are
given in MB. Sizes are decimal (1 MB = 1,000 KB = 10⁶ bytes, as the cost model counts them) unless ``kilo=1024``
(a CPU cache the kernel reports in KiB: 266,240 KB reads ``"260 MB"``).
"""

from __future__ import annotations

GB_FROM_MB = 100_000  # MB up to 100,000 MB, then GB


def _num(v: float, decimals: int) -> str:
    s = f"{v:,.{decimals}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def fmt_mb(mb: float, decimals: int = 1, kilo: int = 1000) -> str:
    """A size given in MB, in the unit that keeps it short (see the module's docstring)."""
    a = abs(mb)
    if a >= GB_FROM_MB:
        return f"{_num(mb / kilo, decimals)} GB"
    if a >= 1 or mb == 0 or round(a * kilo, decimals) >= kilo:  # 0.99996 MB reads 1 MB, not 1,000 KB
        return f"{_num(mb, decimals)} MB"
    kb = mb * kilo
    if round(abs(kb), decimals) >= 1 or round(abs(kb * kilo)) == 0:
        return f"{_num(kb, decimals)} KB"
    return f"{_num(kb * kilo, 0)} B"


def fmt_bytes(n: float, decimals: int = 1) -> str:
    """A size given in bytes: ``fmt_mb(n / 1e6)``."""
    return fmt_mb(n / 1e6, decimals)


def fmt_mb_distinct(*mbs: float) -> list[str]:
    """The sizes in :func:`fmt_mb`'s format with the fewest decimals (one at least, four at most) that keep
    different figures different: a budget of 1,200.05 MB and a need of 1,200.07 MB do not both read 1,200.1 MB."""
    for decimals in range(1, 5):
        out = [fmt_mb(v, decimals) for v in mbs]
        if all(out[i] != out[j] for i in range(len(mbs)) for j in range(i) if mbs[i] != mbs[j]):
            break
    return out
