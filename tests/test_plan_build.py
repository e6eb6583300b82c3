"""The planner's measured steps: --eval builds (sensitivity, pruning) and host calibration.

These run the real pipeline (torch.export -> ONNX -> onnxruntime quantizer -> onnxruntime)
on the digits example.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edgekit.costmodel import Candidate, estimate
from edgekit.planner import Budgets, PlanError, choose, refine
from edgekit.profiles import load_board

sys.path.insert(0, str(Path(__file__).parent))  # plan_nets:digits


@pytest.mark.slow
def test_eval_keeps_sensitive_layers_float(digits, tmp_path):
    b = load_board("jetson-orin-nano-8gb")
    p = choose(str(digits["model"]), b, "jetson", use_calibration=False)
    e16 = estimate(p.stats, b, Candidate("fp16", "7W"))
    e8 = estimate(p.stats, b, Candidate("int8", "7W"))
    # RAM forces int8 (fp16 does not fit) but leaves room to keep a layer in fp32; no accuracy loss allowed
    budgets = Budgets.for_board(b, ram_mb=e8.ram_mb + 0.9 * (e16.ram_mb - e8.ram_mb), accuracy_drop_points=0.0)
    p = choose(None, b, "jetson", budgets, stats=p.stats, use_calibration=False)
    assert p.precision == "int8"
    p = refine(p, str(digits["model"]), str(digits["eval"]), calib=str(digits["calib"]), out=tmp_path / "build")
    first, last = p.eval_steps[0], p.eval_steps[-1]
    if first.drop_points <= 0:
        pytest.skip("int8 lost no accuracy on this run: nothing to refine")
    assert p.sensitivity and len(last.float_layers) >= 1
    assert last.drop_points <= 0 + 1e-9 and last.accuracy > first.accuracy
    assert list(p.candidate.float_layers) == last.float_layers and p.choice.fits
    man = json.loads((tmp_path / "build" / "manifest.json").read_text())
    assert man["artifact"]["quantization"]["nodes_kept_float"] == last.float_layers
    assert "stay fp32" in p.reason


def test_eval_fp32_within_budget_and_int8_needs_calib(digits):
    b = load_board("jetson-nano-4gb")
    p = choose(str(digits["model"]), b, "jetson", Budgets.for_board(b, accuracy_drop_points=0.0),
               use_calibration=False)
    assert p.precision == "fp32"
    p = refine(p, str(digits["model"]), str(digits["eval"]))  # fp32 loses nothing
    assert p.eval_steps[0].drop_points == pytest.approx(0, abs=1e-9)
    # int8 without calibration data is refused up front
    b8 = load_board("jetson-orin-nano-8gb")
    e16, e8 = (estimate(p.stats, b8, Candidate(x, "7W")) for x in ("fp16", "int8"))
    p8 = choose(None, b8, "jetson", Budgets.for_board(b8, ram_mb=(e16.ram_mb + e8.ram_mb) / 2), stats=p.stats,
                use_calibration=False)
    with pytest.raises(PlanError, match="--calib"):
        refine(p8, str(digits["model"]), str(digits["eval"]))


def test_storage_budget_prunes_and_fine_tunes(digits):
    b = load_board("jetson-nano-4gb")
    shape = ["1,1,8,8"]
    p = choose("plan_nets:digits", b, "jetson", input_shape=shape, use_calibration=False)
    full = estimate(p.stats, b, Candidate("fp16", "5W"))
    pruned = estimate(p.stats, b, Candidate("fp16", "5W", 0.25))
    budgets = Budgets.for_board(b, storage_mb=(full.storage_mb + pruned.storage_mb) / 2, accuracy_drop_points=5)
    p = choose(None, b, "jetson", budgets, stats=p.stats, use_calibration=False, prunable=True)
    assert p.candidate.prune_ratio == 0.25 and p.precision == "fp16"
    p = refine(p, "plan_nets:digits", str(digits["eval"]), calib=str(digits["calib"]), input_shape=shape)
    info = p.pruning
    assert info["params_after"] < info["params_before"] and info["macs_after"] < info["macs_before"]
    # the cost model's pruned storage is close to what torch-pruning produced (fp16 weights)
    assert p.choice.estimate.storage_mb == pytest.approx(2 * info["params_after"] / 1e6, rel=0.15)
    assert info["finetune"]["loss_after"] < info["finetune"]["loss_before"]
    assert p.eval_steps[-1].drop_points <= 5


def test_calibrate_host_fits_and_later_plans_use_it(digits):
    from edgekit.calibrate import calibrate, load_fit, store_path

    models = [(str(digits["model"]), None, str(digits["calib"])), ("edgekit.calibrate:gemm_bench", ["1,512"], "random")]
    store = calibrate("host", iterations=10, models=models, precisions=["fp32", "int8"])
    f = store["fit"]
    assert f["samples"] == 4 and set(f["efficiency"]) == {"fp32", "int8"}
    assert f["median_abs_error_after"] <= f["median_abs_error_before"]
    for s in store["samples"]:
        assert s["measured_latency_ms"] > 0 and s["estimated_latency_ms"] > 0
    assert store_path("host/host").exists() and load_fit("host/host") == f
    p = choose(str(digits["model"]), load_board("host"), "jetson")
    assert p.calibrated
    p0 = choose(None, load_board("host"), "jetson", stats=p.stats, use_calibration=False)
    assert p.choice.estimate.latency_ms != pytest.approx(p0.choice.estimate.latency_ms)


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
