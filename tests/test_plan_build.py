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
from edgekit.planner import Budgets, PlanError, choose, weight_layer_names
from edgekit.refine import refine
from edgekit.profiles import load_board

sys.path.insert(0, str(Path(__file__).parent / "support"))  # plan_nets:digits


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_eval_keeps_sensitive_layers_float(digits, tmp_path):
    """INT8 loses most of the accuracy here (plan_nets.digits_int8_fragile: the head cannot be held in
    INT8), so the sensitivity path always runs: the head is found, kept fp32, and the drop is met."""
    model, shape = "plan_nets:digits_int8_fragile", ["1,1,8,8"]
    b = load_board("jetson-orin-nano-8gb")
    p = choose(model, b, "jetson", input_shape=shape, use_calibration=False)
    e16 = estimate(p.stats, b, Candidate("fp16", "7W"))
    e8 = estimate(p.stats, b, Candidate("int8", "7W"))
    # RAM forces int8 (fp16 does not fit) but leaves room to keep a layer in fp32
    budgets = Budgets.for_board(b, ram_mb=e8.ram_mb + 0.9 * (e16.ram_mb - e8.ram_mb), accuracy_drop_points=1.0)
    p = choose(None, b, "jetson", budgets, stats=p.stats, use_calibration=False, prunable=False)
    assert p.precision == "int8" and not p.candidate.float_layers
    p = refine(p, model, str(digits["eval"]), calib=str(digits["calib"]), input_shape=shape, out=tmp_path / "build")
    first, last = p.eval_steps[0], p.eval_steps[-1]
    assert first.float_layers == [] and first.drop_points > 20  # the all-int8 build is far over budget
    head = max(p.sensitivity, key=p.sensitivity.get)
    assert p.sensitivity[head] > 20 and list(p.sensitivity)[0] == head
    assert head in weight_layer_names(p.stats) and "linear" in head  # the fragile layer is the head
    assert last.float_layers == [head] and last.drop_points <= 1.0 + 1e-9 and last.accuracy > first.accuracy + 0.2
    assert list(p.candidate.float_layers) == [head] and p.choice.fits
    assert p.choice.estimate.ram_mb > e8.ram_mb  # the fp32 head is in the estimate
    man = json.loads((tmp_path / "build" / "manifest.json").read_text())
    assert man["artifact"]["quantization"]["nodes_kept_float"] == [head]
    assert man["verification"]["converted_accuracy"] == pytest.approx(last.accuracy)
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
