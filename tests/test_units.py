"""The one size format (edgekit.units): at most one decimal, thousands separators, KB / MB / GB chosen by size."""

from __future__ import annotations

import re

import pytest

from edgekit.units import fmt_bytes, fmt_mb, fmt_mb_distinct


@pytest.mark.parametrize("mb, text", [
    (4138.4, "4,138.4 MB"), (6326.25, "6,326.2 MB"), (300, "300 MB"), (300.0657, "300.1 MB"), (65536, "65,536 MB"),
    (51200.0, "51,200 MB"), (1.04, "1 MB"), (0, "0 MB"), (0.0657, "65.7 KB"), (0.05751, "57.5 KB"),
    (0.99996, "1 MB"), (0.0001, "100 B"), (131072, "131.1 GB"),
])
def test_fmt_mb(mb, text):
    assert fmt_mb(mb) == text


def test_fmt_bytes_and_binary_kilo():
    assert fmt_bytes(70_000) == "70 KB" and fmt_bytes(3.2e9) == "3,200 MB" and fmt_bytes(512) == "512 B"
    assert fmt_mb(266240 / 1024, kilo=1024) == "260 MB"  # a CPU cache the kernel reports in KiB
    assert fmt_mb(512 / 1024, kilo=1024) == "512 KB"


def test_never_more_than_one_decimal_nor_a_long_kb_figure():
    for mb in (0.000123, 0.0123456, 0.123456, 0.999, 1.23456, 12.3456, 1234.5678, 99_999.9, 123_456.789):
        s = fmt_mb(mb)
        assert re.fullmatch(r"\d{1,3}(,\d{3})*(\.\d)? (B|KB|MB|GB)", s), s
        assert not re.search(r"\d{5,}", s), s  # thousands separated: no "266240 KB"


def test_close_figures_keep_enough_decimals_to_differ():
    assert fmt_mb_distinct(1200.05, 1200.07, 1200.03) == ["1,200.05 MB", "1,200.07 MB", "1,200.03 MB"]
    assert fmt_mb_distinct(300.0657, 6326.25) == ["300.1 MB", "6,326.2 MB"]  # one decimal where that tells them apart


def test_host_cpu_caches_read_in_the_size_format():
    from edgekit.hostcpu import HostCPU

    cpu = HostCPU(model="x", arch="x86_64", cores=2, clock_mhz=2000, isa="avx2", fp32_ops_per_clk=32,
                  int8_ops_per_clk=128, fp16_ops_per_clk=32, l2_kb=2048, l3_kb=266240, ram_mb=4096)
    assert "L2 2 MB/core, L3 260 MB" in cpu.describe()
