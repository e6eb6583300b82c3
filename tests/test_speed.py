"""The artifact's speed in the verdict (edgekit.speed): an INT8 build is timed against its float build on the
target's host runtime, reported in the manifest, the CLI and the report, and a slower one fails."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from edgekit.cli import app
from edgekit.speed import CONSISTENT, MARGIN, MIN_DIFF_MS, Speed, interleaved, verdict


def _speed(float_ms: float, ms: float, judged: bool = True, pairs_slower: float | None = None) -> Speed:
    return Speed(runtime="LiteRT (XNNPACK, 1 thread)", float_ms=float_ms, ms=ms, runs=20, kernels="12 ops int8",
                 judged=judged, not_judged="" if judged else "the board's NPU runs it", pairs_slower=pairs_slower)


def test_slower_means_beyond_what_the_timing_tells_apart():
    assert _speed(1.0, 1.0 + 2 * MARGIN).slower  # 20 % slower
    assert not _speed(1.0, 1.0 + MARGIN / 2).slower  # within the relative margin: noise
    assert not _speed(0.004, 0.009).slower  # 2x, 5 µs apart, and no record of the pairs: not told apart
    assert _speed(0.01, 0.01 + 2 * MIN_DIFF_MS).slower
    assert not _speed(3.6, 1.2).slower and _speed(3.6, 1.2).speedup == pytest.approx(3.0)
    # past both margins, the pairs decide: a slower median from a few stalled runs is not slower
    assert _speed(1.0, 1.3, pairs_slower=0.97).slower
    assert not _speed(1.0, 1.3, pairs_slower=CONSISTENT - 0.1).slower  # medians apart, pairs split: noise
    assert not _speed(1.0, 1.0 + MARGIN / 2, pairs_slower=1.0).slower  # consistent but within the margin
    assert not _speed(0.0025, 0.0038, pairs_slower=1.0).slower  # 1.5x, 1.3 µs apart: the edges' overhead


def test_a_slower_int8_build_fails_unless_accepted_or_not_judged_here():
    slow = _speed(3.6, 94.5)
    why = verdict(slow, "int8", allowed=False)
    assert why is not None and why.startswith("speed: the INT8 build runs 26.25x slower than the fp32 build")
    assert "--allow-slower-int8" in why and "3.6 ms" in why and "94.5 ms" in why
    assert verdict(slow, "int8", allowed=True) is None
    assert verdict(_speed(3.6, 94.5, judged=False), "int8", allowed=False) is None  # an NPU that runs it natively
    assert verdict(slow, "fp16", allowed=False) is None  # only INT8 is judged by speed
    assert verdict(_speed(3.6, 1.2), "int8", allowed=False) is None
    assert "3.00x faster" in _speed(3.6, 1.2).line("int8") and "slower" in slow.line("int8")


def test_interleaved_timing_tells_a_slow_call_from_a_fast_one():
    fast_ms, slow_ms, runs, share = interleaved(lambda: time.sleep(0.001), lambda: time.sleep(0.004), budget_s=0.5)
    assert runs >= 5 and slow_ms > fast_ms * (1 + MARGIN) and fast_ms > 0.9  # sleep(1 ms): at least 1 ms
    assert share >= CONSISTENT and _speed(fast_ms, slow_ms, pairs_slower=share).slower
    same = interleaved(lambda: sum(range(2000)), lambda: sum(range(2000)), budget_s=0.3)
    assert not _speed(same[0], same[1], pairs_slower=same[3]).slower


@pytest.mark.slow
def test_an_android_int8_build_is_timed_against_its_fp32_build(digits, tmp_path):
    """digits to android INT8: the manifest's speed record (LiteRT, one thread, interleaved runs), the CLI line and
    the report note; the verdict follows the record (a build recorded slower did not pass)."""
    pytest.importorskip("litert_torch")
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["convert", str(digits["model"]), "-t", "android", "-p", "int8", "--calib",
                                 str(digits["calib"]), "--no-cache", "-o", str(out), "--json"])
    import json

    man = json.loads((out / "manifest.json").read_text())
    sp = man["artifact"]["speed"]
    assert sp["runtime"].startswith("LiteRT") and "1 thread" in sp["runtime"] and sp["runs"] >= 5
    assert sp["float_ms"] > 0 and sp["ms"] > 0 and sp["speedup"] == pytest.approx(sp["float_ms"] / sp["ms"], rel=1e-2)
    assert "int8 on XNNPACK" in sp["kernels"]
    assert man["verification"]["passed"] == (not sp["slower"]) and (r.exit_code == 0) == man["verification"]["passed"]
    assert "speed on LiteRT" in (out / "report.md").read_text()
    assert man["timings_s"]["speed"] >= 0


def test_a_jetson_int8_build_is_estimated_against_the_fp16_engine_with_its_kept_layers(digits, tmp_path):
    """jetson: onnxruntime on this CPU does not stand for TensorRT, so the INT8 engine is priced by the cost model
    at the precision TensorRT runs each layer: every conv on INT8 kernels; a conv kept out of Q/DQ on fp16 kernels
    with a reformat before and after it, which costs time. The figures are an estimate and never judge."""
    import json

    def build(out, *extra):
        r = CliRunner().invoke(app, ["convert", str(digits["model"]), "-t", "jetson", "-p", "int8", "--calib",
                                     str(digits["calib"]), "--no-cache", "-o", str(out), *extra])
        assert r.exit_code == 0, r.output
        return json.loads((out / "manifest.json").read_text())["artifact"]["speed"], r.output

    sp, out = build(tmp_path / "all")
    assert sp["estimated"] and sp["runs"] == 0 and not sp["judged"] and sp["float_precision"] == "fp16"
    assert sp["runtime"] == "TensorRT on jetson-orin-nano-8gb at 15W, cost model"
    assert sp["kernels"] == "4 of 4 conv / matmul layers on INT8 kernels"
    assert "fp16 build's speed, estimated" in out
    kept, _ = build(tmp_path / "kept", "--option", "keep_float_nodes=node_Conv_28")
    assert kept["kernels"] == ("3 of 4 conv / matmul layers on INT8 kernels, 1 on fp16 kernels with a reformat "
                               "before and after each")
    assert kept["ms"] > sp["ms"] and kept["float_ms"] == sp["float_ms"]


def test_the_planner_prices_kept_layers_at_the_precision_the_target_runs_them():
    """TensorRT and Core ML run a layer kept out of INT8 in fp16; LiteRT runs it on fp32 kernels."""
    from edgekit.profiles import load_target

    assert load_target("jetson").kept_precision == "fp16" and load_target("ios").kept_precision == "fp16"
    assert load_target("android").kept_precision == "fp32"
