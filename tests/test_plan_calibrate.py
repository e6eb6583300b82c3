"""The cost model's constants: this machine's CPU read off it, op classes, and calibration.

Calibration runs the real pipeline (torch.export -> ONNX -> onnxruntime) on the digits example
and a micro-benchmark, times them with onnxruntime on this CPU, and fits the host board.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgekit.costmodel import Candidate, estimate
from edgekit.planner import choose
from edgekit.profiles import load_board, load_target

sys.path.insert(0, str(Path(__file__).parent / "support"))  # plan_nets


@pytest.fixture(scope="module")
def mnv2_stats():
    from edgekit.planner import model_stats as analyze_model

    return analyze_model("plan_nets:mobilenetv2", load_target("jetson"), ["1,3,96,96"])[1]


# ---------------------------------------------------------------- host CPU


@pytest.mark.parametrize("flags,arch,family,expect", [
    ("fma avx avx2", "x86_64", 25, ("avx2+fma", 32, 64, 32)),  # Zen 3: no VNNI
    ("fma avx avx2 avx512f avx512_vnni avx_vnni", "x86_64", 26, ("avx512+vnni", 64, 256, 64)),  # Zen 5
    ("fma avx avx2 avx512f avx512_vnni", "x86_64", 25, ("avx512+vnni", 32, 128, 32)),  # Zen 4: 2 x 256-bit halves
    ("fma avx avx2 avx512f avx512_vnni avx512_fp16", "x86_64", 6, ("avx512+vnni", 64, 256, 128)),  # Sapphire Rapids
    ("fp asimd asimdhp asimddp", "aarch64", None, ("neon+dotprod", 16, 64, 32)),  # Cortex-A76
    ("sse sse2", "x86_64", 6, ("sse2", 8, 16, 8)),
])
def test_ops_per_clock_from_cpu_flags(flags, arch, family, expect):
    from edgekit.hostcpu import from_flags

    assert from_flags(set(flags.split()), arch, family) == expect


def test_host_board_peak_is_this_machine():
    from edgekit.hostcpu import detect

    cpu = detect()
    assert cpu.cores >= 1 and cpu.clock_mhz > 0 and cpu.fp32_ops_per_clk >= 8
    b = load_board("host")
    peak = b.power_modes[b.default_power_mode].peak_tops
    assert peak["fp32"] == pytest.approx(cpu.cores * cpu.clock_mhz * 1e6 * cpu.fp32_ops_per_clk / 1e12, rel=1e-3)
    assert peak["int8"] >= 2 * peak["fp32"]
    assert "detected" in b.description
    # --set still wins over detection
    assert load_board("host", ["power_modes.default.peak_tops={fp32=1.0,fp16=1.0,int8=2.0}"]) \
        .power_modes["default"].peak_tops["fp32"] == 1.0


def test_host_board_without_cpuinfo_keeps_the_profile_figures(monkeypatch):
    import tomllib

    from edgekit import hostcpu
    from edgekit.profiles import board_files

    monkeypatch.setattr(hostcpu, "_cpuinfo", lambda: {})  # macOS / Windows: no /proc/cpuinfo
    hostcpu.detect.cache_clear()
    try:
        assert hostcpu.detect() is None
        b = load_board("host")
        toml = tomllib.loads(board_files()["host/host"].read_text())
        assert b.power_modes["default"].peak_tops == toml["power_modes"]["default"]["peak_tops"]
        assert b.ram_mb == toml["ram_mb"] and "detected" not in b.description
    finally:
        hostcpu.detect.cache_clear()


# ---------------------------------------------------------------- op classes and activation passes


def test_depthwise_and_gemm_layers_have_their_own_efficiency(mnv2_stats):
    classes = {layer.op_class for layer in mnv2_stats.layers}
    assert {"conv", "dwconv", "gemm"} <= classes
    b = load_board("host")
    cand = Candidate("fp32", b.default_power_mode)
    base = estimate(mnv2_stats, b, cand)
    slow_dw = estimate(mnv2_stats, b.model_copy(update={"class_efficiency": {"dwconv": 0.01}}), cand)
    dw_base = sum(lc.latency_ms for lc in base.layers if lc.op_class == "dwconv")
    dw_slow = sum(lc.latency_ms for lc in slow_dw.layers if lc.op_class == "dwconv")
    assert dw_slow > 5 * dw_base
    # only the depthwise layers changed
    other = [(a.latency_ms, c.latency_ms) for a, c in zip(base.layers, slow_dw.layers) if a.op_class != "dwconv"]
    assert all(x == pytest.approx(y) for x, y in other)


def test_activation_passes_cost_launches_and_bytes(mnv2_stats):
    b = load_board("host").model_copy(update={"activation_passes": {}})  # the profile's own passes aside
    cand = Candidate("int8", b.default_power_mode)
    base = estimate(mnv2_stats, b, cand)
    two = estimate(mnv2_stats, b.model_copy(update={"activation_passes": {"int8": 2.0}}), cand)
    launched = [lc for lc in base.layers if lc.launch_ms > 0]
    extra_launch = 2 * len(launched) * b.launch_overhead_us / 1e3
    out_bytes = sum(lc2.passes_ms for lc2 in two.layers)
    assert out_bytes > 0
    assert two.latency_ms == pytest.approx(base.latency_ms + extra_launch + out_bytes, rel=1e-9)
    # other precisions are untouched
    fp32 = Candidate("fp32", b.default_power_mode)
    assert estimate(mnv2_stats, b.model_copy(update={"activation_passes": {"int8": 2.0}}), fp32).latency_ms == \
        pytest.approx(estimate(mnv2_stats, b, fp32).latency_ms)


# ---------------------------------------------------------------- fitting


def test_fit_recovers_the_constants_that_made_the_latencies(mnv2_stats, digits):
    """Closed loop: latencies computed by the cost model with known constants are fitted back."""
    from edgekit.calibrate import constants, fit, median_abs_error, predict, sample_terms
    from edgekit.planner import model_stats as analyze_model

    b = load_board("host")
    truth = {"efficiency": {"fp32": 0.3, "int8": 0.08}, "class_efficiency": {"dwconv": 0.5, "gemm": 0.5},
             "activation_passes": {"fp32": 0.0, "int8": 4.0}, "launch_overhead_us": 8.0, "bandwidth_factor": 0.7}
    digits_stats = analyze_model(str(digits["model"]), load_target("jetson"))[1]
    samples = []
    for stats in (mnv2_stats, digits_stats):
        for prec in ("fp32", "int8"):
            s = {"precision": prec, "model": "m", "model_sha256": "x", **sample_terms(stats, b, prec)}
            s["measured_latency_ms"] = predict(s, truth)
            samples.append(s)
    start = constants(b)
    assert median_abs_error(samples, start) > 0.2
    f = fit(samples, start)
    assert median_abs_error(samples, f) < 0.02  # four samples cannot pin nine constants: the fit, not each value
    assert f["efficiency"]["fp16"] == start["efficiency"]["fp16"]  # no fp16 sample: left where the profile had it
    assert "efficiency.fp16" not in f["fitted"] and "class_efficiency.dwconv" in f["fitted"]


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_calibrate_host_fits_and_later_plans_use_it(digits):
    from edgekit.calibrate import calibrate
    from edgekit.calibration_store import load_fit, store_path

    models = [(str(digits["model"]), None, str(digits["calib"])), ("edgekit.calibrate:gemm_bench", ["1,512"], "random")]
    store = calibrate("host", iterations=10, models=models, precisions=["fp32", "int8"])
    f = store["fit"]
    assert f["samples"] == 4
    assert {"efficiency.fp32", "efficiency.int8"} <= set(f["fitted"]) and "efficiency.fp16" not in f["fitted"]
    assert f["median_abs_error_after"] <= f["median_abs_error_before"]
    for s in store["samples"]:
        assert s["measured_latency_ms"] > 0 and s["estimated_latency_ms"] > 0
    assert store_path("host/host").exists() and load_fit("host/host") == f
    p = choose(str(digits["model"]), load_board("host"), "jetson")
    assert p.calibrated
    p0 = choose(None, load_board("host"), "jetson", stats=p.stats, use_calibration=False)
    assert p.choice.estimate.latency_ms != pytest.approx(p0.choice.estimate.latency_ms)
    # the calibrated board's estimate is the fitted prediction of the measured sample
    from edgekit.calibrate import predict
    from edgekit.costmodel import calibrated

    s = next(s for s in store["samples"] if s["precision"] == "fp32" and s["model"] == str(digits["model"]))
    cb = calibrated(load_board("host"))
    assert estimate(p.stats, cb, Candidate("fp32", cb.default_power_mode)).latency_ms == \
        pytest.approx(predict(s, f), rel=1e-6)


def test_calibrate_board_without_measurements_fails(tmp_path, monkeypatch):
    from edgekit.calibrate import calibrate
    from edgekit.errors import ProfileError

    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("EDGEKIT_RESULTS_DB", str(tmp_path / "results.sqlite"))
    with pytest.raises(ProfileError, match="no measurements"):
        calibrate("jetson-orin-nano-8gb")


def test_calibrate_from_results_store_smoke_measurements(tmp_path, monkeypatch):
    """Smoke results of a real board (issue 7's results store) recalibrate that board's cost model."""
    from edgekit import results
    from edgekit.calibrate import calibrate

    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("EDGEKIT_RESULTS_DB", str(tmp_path / "results.sqlite"))
    b = load_board("jetson-orin-nano-8gb")
    # the board ran twice as fast as estimated, at fp16
    for sha, est in (("a" * 64, 2.0), ("b" * 64, 8.0)):
        results.record("smoke", board_id=b.id, model_sha256=sha, precision="fp16",
                       estimated_latency_ms=est, measured_latency_ms=est / 2, passed=True)
    store = calibrate(b.id)
    f = store["fit"]
    assert f["results_store_samples"] == 2
    assert f["efficiency"]["fp16"] == pytest.approx(2 * b.efficiency["fp16"], rel=0.1)
    assert f["median_abs_error_after"] < 0.1 < f["median_abs_error_before"]
    assert f["launch_overhead_us"] == b.launch_overhead_us  # whole-model samples cannot move it
    assert f["fitted"] == ["efficiency.fp16"]
