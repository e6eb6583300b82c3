"""The budget-driven planner: cost model, search, failure reasons, CLI, report.html, --precision auto.

Budgets are set between two candidates' estimates, so the right choice is known without
hard-coding any estimate: the test fails if the planner picks the wrong side.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from edgekit.errors import ProfileError
from edgekit.costmodel import FUSED_OPS, Candidate, calibrated, estimate
from edgekit.planner import Budgets, PlanError, candidates, choose
from edgekit.profiles import list_boards, load_board, load_target
from edgekit.units import fmt_mb

sys.path.insert(0, str(Path(__file__).parent / "support"))  # plan_nets:mobilenetv2


@pytest.fixture(scope="module")
def digits_stats(digits):
    from edgekit.planner import model_stats as analyze_model

    return analyze_model(str(digits["model"]), load_target("jetson"))[1]


@pytest.fixture(scope="module")
def mnv2_stats():
    from edgekit.planner import model_stats as analyze_model

    return analyze_model("plan_nets:mobilenetv2", load_target("jetson"), ["1,3,96,96"])[1]


def _est(stats, board, prec, mode=None, **kw):
    return estimate(stats, board, Candidate(prec, mode or board.default_power_mode, **kw))


def test_cost_model_orders_precisions_and_energy(digits_stats):
    b = load_board("jetson-orin-nano-8gb")
    e32, e16, e8 = (_est(digits_stats, b, p) for p in ("fp32", "fp16", "int8"))
    assert e32.ram_mb > e16.ram_mb > e8.ram_mb > b.runtime_overhead_mb
    assert e32.storage_mb == pytest.approx(2 * e16.storage_mb, rel=1e-6)
    assert e8.storage_mb < e16.storage_mb
    for e in (e32, e16, e8):
        assert e.energy_mj == pytest.approx(e.power_w * e.latency_ms)
        assert e.latency_ms == pytest.approx(sum(lc.latency_ms for lc in e.layers))
        # every layer pays at least its launch overhead
        launched = [lay for lay in digits_stats.layers if lay.op not in FUSED_OPS]
        assert 0 < len(launched) < len(digits_stats.layers)  # Relu / Reshape ride along with their producer
        assert e.latency_ms >= len(launched) * b.launch_overhead_us / 1e3
    # a faster power mode is never slower, and draws more power
    slow, fast = _est(digits_stats, b, "fp16", "7W"), _est(digits_stats, b, "fp16", "25W")
    assert fast.latency_ms <= slow.latency_ms and fast.power_w > slow.power_w
    # pruning cuts MACs, weights and activations
    p50 = _est(digits_stats, b, "fp16", prune_ratio=0.5)
    assert p50.storage_mb < e16.storage_mb and p50.activations_mb < e16.activations_mb
    # 2:4 sparsity halves the stored weights plus index bits
    sp = _est(digits_stats, b, "int8", sparsity="2:4")
    assert e8.storage_mb * 0.5 < sp.storage_mb < e8.storage_mb


def test_default_budgets_pick_least_compressed(digits_stats):
    for board in ("jetson-nano-4gb", "jetson-orin-nano-8gb", "host"):
        p = choose(None, load_board(board), "jetson", stats=digits_stats, use_calibration=False)
        assert p.precision == "fp32" and p.candidate.prune_ratio == 0, (board, p.reason)
        assert "least compressed" in p.reason


def test_apple_boards_auto_pick_the_neural_engines_fp16(digits_stats):
    for board in ("iphone-15-pro", "iphone-13", "ipad-pro-m4"):
        b = load_board(board)
        assert b.native_precision == "fp16"
        p = choose(None, b, "ios", stats=digits_stats, use_calibration=False)
        assert p.precision == "fp16" and p.candidate.prune_ratio == 0, (board, p.reason)
        assert "accelerator computes in fp16" in p.reason
        # fp32 still fits: the choice is the ANE's precision, not a budget forcing compression
        assert any(s.fits and s.estimate.candidate.precision == "fp32" for s in p.candidates)
    with pytest.raises(ProfileError, match="native_precision int4 is not in the power modes"):
        load_board("iphone-15-pro", ["native_precision=int4"])


def test_nano_never_gets_int8_and_tight_ram_forces_fp16(digits_stats):
    b = load_board("jetson-nano-4gb")
    assert all(c.precision != "int8" for c in candidates(b, load_target("jetson")))
    e32, e16 = _est(digits_stats, b, "fp32"), _est(digits_stats, b, "fp16")
    budgets = Budgets.for_board(b, ram_mb=(e32.ram_mb + e16.ram_mb) / 2)
    p = choose(None, b, "jetson", budgets, stats=digits_stats, use_calibration=False)
    assert p.precision == "fp16" and p.candidate.prune_ratio == 0
    assert p.reason.startswith("fp16") and "RAM budget" in p.reason
    assert all(s.estimate.candidate.precision != "int8" for s in p.candidates)


def test_ram_budget_forces_int8_on_orin(digits_stats):
    b = load_board("jetson-orin-nano-8gb")
    e16, e8 = _est(digits_stats, b, "fp16"), _est(digits_stats, b, "int8")
    budgets = Budgets.for_board(b, ram_mb=(e16.ram_mb + e8.ram_mb) / 2)
    p = choose(None, b, "jetson", budgets, stats=digits_stats, use_calibration=False)
    assert p.precision == "int8" and p.candidate.prune_ratio == 0 and p.candidate.sparsity is None
    assert "RAM budget" in p.reason
    assert p.choice.fits and p.choice.estimate.ram_mb <= budgets.ram_mb
    # candidates KB apart on a 300 MB runtime: the reason's figures keep the decimals that tell them apart
    figs = re.findall(r"([\d,]+(?:\.\d+)?) MB", p.reason)
    assert len(figs) == 3 and len(set(figs)) == 3, p.reason


def test_pareto_plot_integer_colour_bar_and_a_legend_of_what_is_drawn(digits_stats, monkeypatch):
    pytest.importorskip("matplotlib")
    from edgekit import report_html

    monkeypatch.setattr(report_html, "_png", lambda fig: fig)
    b = load_board("jetson-orin-nano-8gb")
    everything = choose(None, b, "jetson", stats=digits_stats, use_calibration=False)
    fastest = min(s.estimate.latency_ms for s in everything.candidates)
    only_one = choose(None, b, "jetson", Budgets.for_board(b, latency_ms=fastest * 1.000001), stats=digits_stats,
                      use_calibration=False)
    for p in (everything, only_one):
        fig = report_html.pareto(p)
        ax, cax = fig.axes
        ticks = cax.get_yticks()
        assert len(ticks) and all(float(t).is_integer() for t in ticks), ticks  # a whole-number rank
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        drawn = {ln.get_label(): len(ln.get_xdata()) for ln in ax.get_lines()}
        assert "Pareto front (fits)" not in labels or drawn["Pareto front (fits)"] > 1, labels  # a line, not a dot
    # what fits there ties on latency: a front of one point, which has no line, so no legend entry
    assert "Pareto front (fits)" not in [t.get_text() for t in report_html.pareto(only_one).axes[0].get_legend().get_texts()]


def test_latency_budget_forces_pruning(mnv2_stats):
    b = load_board("jetson-nano-4gb")
    t = load_target("jetson")
    unpruned = min(_est(mnv2_stats, b, p, m).latency_ms for p in ("fp32", "fp16") for m in b.power_modes)
    pruned = min(_est(mnv2_stats, b, p, m, prune_ratio=0.5).latency_ms for p in ("fp32", "fp16") for m in b.power_modes)
    assert pruned < unpruned
    budgets = Budgets.for_board(b, latency_ms=(pruned + unpruned) / 2)
    p = choose(None, b, t, budgets, stats=mnv2_stats, use_calibration=False, prunable=True)
    assert p.candidate.prune_ratio > 0
    assert p.choice.estimate.latency_ms <= budgets.latency_ms
    assert "latency budget" in p.reason
    # without pruning allowed, the same budget cannot be met
    with pytest.raises(PlanError, match="latency budget"):
        choose(None, b, t, budgets, stats=mnv2_stats, use_calibration=False, prunable=False)


def test_pruned_candidates_only_where_prune_can_rebuild_the_model(digits, tmp_path):
    """A .pt2 or TorchScript file has no nn.Module left to prune: the planner offers no pruned build
    (one it could not make) and says why; the same network as a factory gets pruned candidates."""
    import torch

    import plan_nets
    from edgekit.ingest import load_model
    from edgekit.prune import can_prune

    b, shape = load_board("jetson-nano-4gb"), ["1,1,8,8"]
    ts = tmp_path / "digits.pt"
    torch.jit.save(torch.jit.trace(plan_nets.digits(), torch.zeros(1, 1, 8, 8)), str(ts))
    factory = choose("plan_nets:digits", b, "jetson", input_shape=shape, use_calibration=False)
    assert {s.estimate.candidate.prune_ratio for s in factory.candidates} == {0.0, 0.25, 0.5}
    assert not factory.notes and can_prune(load_model("plan_nets:digits", shape))
    full = _est(factory.stats, b, "fp16", "5W")
    pruned = _est(factory.stats, b, "fp16", "5W", prune_ratio=0.25)
    # a storage budget only a pruned build meets (the nano has no int8)
    budgets = Budgets.for_board(b, storage_mb=(full.storage_mb + pruned.storage_mb) / 2)
    assert choose("plan_nets:digits", b, "jetson", budgets, input_shape=shape,
                  use_calibration=False).candidate.prune_ratio == 0.25
    for model, kind in ((str(digits["model"]), "exported_program"), (str(ts), "torchscript")):
        m = load_model(model, shape)
        assert m.kind == kind and not can_prune(m)
        p = choose(model, b, "jetson", input_shape=shape, use_calibration=False)
        assert p.candidates and all(s.estimate.candidate.prune_ratio == 0 for s in p.candidates), kind
        assert any(f"(kind {kind}: no nn.Module left)" in n and "pkg.module:factory" in n for n in p.notes), p.notes
        with pytest.raises(PlanError, match="storage budget") as exc:  # not a pruned choice refine cannot build
            choose(model, b, "jetson", budgets, input_shape=shape, use_calibration=False)
        assert "pkg.module:factory" in str(exc.value)


def test_impossible_budget_fails_with_reason_and_amount(digits_stats):
    b = load_board("jetson-orin-nano-8gb")
    best = min(_est(digits_stats, b, "int8", m, prune_ratio=0.5).latency_ms for m in b.power_modes)
    limit = best / 10
    with pytest.raises(PlanError) as exc:
        choose(None, b, "jetson", Budgets.for_board(b, latency_ms=limit), stats=digits_stats, use_calibration=False)
    msg = str(exc.value)
    assert "latency budget" in msg and "cannot be met" in msg and "nearest candidate" in msg
    assert "--max-latency-ms" in msg
    needed = float(re.search(r"needs ([\d.e+-]+) ms", msg).group(1))
    assert needed > limit


def test_sparsity_only_where_board_supports_it():
    t = load_target("jetson")
    for b in list_boards("jetson"):
        has = any(c.sparsity == "2:4" for c in candidates(b, t))
        assert has == b.sparsity_2_4, b.id
    assert load_board("jetson-orin-nano-8gb").sparsity_2_4 and not load_board("jetson-nano-4gb").sparsity_2_4


def test_calibration_store_is_applied(digits_stats, tmp_path, monkeypatch):
    from edgekit.calibration_store import save_store

    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path))
    b = load_board("host")
    assert calibrated(b) is b
    save_store(b.id, {"board": b.id, "samples": [], "fit": {"efficiency": {"fp32": 0.9}, "launch_overhead_us": 1.0,
                                                            "bandwidth_factor": 2.0}})
    cb = calibrated(b)
    assert cb.efficiency["fp32"] == 0.9 and cb.launch_overhead_us == 1.0
    assert cb.memory_bandwidth_gbps == pytest.approx(2 * b.memory_bandwidth_gbps)
    p = choose(None, b, "jetson", stats=digits_stats)
    assert p.calibrated
    assert p.choice.estimate.latency_ms != pytest.approx(_est(digits_stats, b, "fp32").latency_ms)


def test_cli_plan_json_and_report(digits, tmp_path):
    from typer.testing import CliRunner

    from edgekit.cli import app

    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["plan", str(digits["model"]), "--board", "jetson-nano-4gb", "--max-ram-mb", "1200.05",
                                 "--json", "-o", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["choice"]["candidate"]["precision"] == "fp16"
    assert plan["budgets"]["ram_mb"] == 1200.05
    assert plan["choice"]["layers"] and plan["candidates"]
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", html)  # opens offline: nothing fetched
    assert "http://" not in html and "https://" not in html
    for png in ("budgets.png", "pareto.png", "layers.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # run again into the same folder: replaced, not refused
    r2 = CliRunner().invoke(app, ["plan", str(digits["model"]), "--board", "jetson-nano-4gb", "-o", str(out)])
    assert r2.exit_code == 0, r2.output
    assert "choice:" in r2.stdout


def test_cli_plan_figures_are_readable_and_explained(digits, monkeypatch):
    from typer.testing import CliRunner

    from edgekit.cli import app

    monkeypatch.setenv("COLUMNS", "200")
    r = CliRunner().invoke(app, ["plan", str(digits["model"]), "--board", "jetson-orin-nano-8gb"])
    assert r.exit_code == 0, r.output
    b = load_board("jetson-orin-nano-8gb")
    assert not re.search(r"\d[eE][+-]\d", r.stdout), r.stdout  # no 6.554e+04 MB
    assert f"storage {b.storage_mb:,} MB" in r.stdout
    # the runtime's own RAM is its own figure, and the budget is the model's share plus it
    share = b.budgets.model_ram_share * b.ram_mb
    assert (f"RAM {share + b.runtime_overhead_mb:,.0f} MB for the whole process (runtime overhead "
            f"{b.runtime_overhead_mb:,.0f} MB + model {share:,.0f} MB)") in r.stdout
    assert "binds" not in r.stdout  # a fitting candidate is never said to bind
    rows = [ln for ln in r.stdout.splitlines() if "/ 7W " in ln or "/ 25W " in ln]
    assert rows and all(("yes (" in ln) != ("no: power" in ln) for ln in rows), rows
    # one size format: one decimal at most, a small model's share in KB
    assert re.search(r"tightest: RAM at \d+% of [\d,]+(\.\d)? MB \(runtime [\d,]+(\.\d)? MB \+ model \d+(\.\d)? KB\)",
                     r.stdout), r.stdout
    assert not re.search(r"\d\.\d\d+ (MB|KB)", r.stdout), r.stdout


def test_cli_plan_impossible_budget_exit_2(digits):
    from typer.testing import CliRunner

    from edgekit.cli import app

    r = CliRunner().invoke(app, ["plan", str(digits["model"]), "--board", "jetson-orin-nano-8gb",
                                 "--max-latency-ms", "0.0001"])
    assert r.exit_code != 0
    assert isinstance(r.exception, PlanError) and "latency budget" in str(r.exception)


def test_convert_precision_auto_uses_the_plan(digits, tmp_path):
    from edgekit.pipeline import convert

    b = load_board("jetson-nano-4gb")
    res = convert(str(digits["model"]), target="jetson", out=tmp_path / "b", board="jetson-nano-4gb",
                  precision="auto", eval_data=str(digits["eval"]))
    man = res.manifest
    assert man["precision"] == "fp32"  # least compressed fits the nano's default budgets
    assert man["plan"]["chosen_by"] == "planner" and "least compressed" in man["plan"]["reason"]
    assert man["plan"]["estimate"]["ram_mb"] > b.runtime_overhead_mb
    # one set of budget figures: the manifest (what the smoke test judges) holds the plan's, report.md shows them
    assert {k: man["budgets"][k] for k in ("ram_mb", "power_w", "latency_ms")} == {
        k: man["plan"]["budgets"][k] for k in ("ram_mb", "power_w", "latency_ms")}
    assert man["budgets"]["runtime_overhead_mb"] == b.runtime_overhead_mb
    report = (res.out_dir / "report.md").read_text()
    mode = man["plan"]["power_mode"]
    assert f"Power mode **{mode}** ({b.power_modes[mode].power_w:g} W), chosen by the planner." in report
    est, budget = man["plan"]["estimate"]["ram_mb"], man["budgets"]["ram_mb"]
    assert f"| RAM, whole process | {fmt_mb(est)} | {fmt_mb(budget)} |" in report  # the one size format
    assert f"| · runtime overhead | {fmt_mb(b.runtime_overhead_mb)} |" in report
    assert re.search(r"\| · model \(weights \+ activations\) \| \d+(\.\d)? KB \|", report), report
    # a user-chosen precision still carries the estimate (for recalibration from smoke results)
    res2 = convert(str(digits["model"]), target="jetson", out=tmp_path / "c", board="jetson-nano-4gb", precision="fp16")
    assert res2.manifest["plan"]["chosen_by"] == "user"
    assert res2.manifest["plan"]["estimate"]["storage_mb"] < man["plan"]["estimate"]["storage_mb"]


TINY = Path(__file__).parent.parent / "examples" / "tinyml_fpga"


def test_fpga_plan_uses_the_fabric_estimate_the_build_makes():
    """On an FPGA board the plan's latency is the fabric's timing estimate (hls4ml's dataflow, at the reuse factor
    that fits) and the share of the fabric is a budget: ResNet-8 fits a PYNQ-Z2 only at a reuse factor > 1, and
    int4 (narrower LUT multipliers) fits at a smaller one, so it is estimated faster."""
    from edgekit import fabric
    from edgekit.planner import model_stats

    board = load_board("xilinx/pynq-z2")
    stats = model_stats(str(TINY / "resnet8.pt2"), load_target("fpga"))[1]
    p = choose(None, board, "fpga", stats=stats, use_calibration=False)
    assert p.precision == "int8"
    fab = p.choice.estimate.fabric
    assert fab["fits"] and fab["reuse_factor"] > 1 and fab["share"] <= fabric.FIT_SHARE
    assert p.choice.estimate.latency_ms == pytest.approx(fab["latency_us"] / 1e3)
    assert fab["layers"] == 11  # 9 convs, the global average pool (a depthwise conv on the fabric), the classifier
    assert any(n.startswith("fabric ESTIMATE at reuse factor") and "LUT of 53,200" in n for n in p.notes)
    i4 = next(s for s in p.candidates if s.estimate.candidate.precision == "int4").estimate
    assert i4.fabric["reuse_factor"] <= fab["reuse_factor"] and i4.latency_ms <= p.choice.estimate.latency_ms
    # a larger board takes the same model at a smaller reuse factor: faster
    big = choose(None, load_board("xilinx/zcu104"), "fpga", stats=stats, use_calibration=False)
    assert big.choice.estimate.fabric["reuse_factor"] < fab["reuse_factor"]
    assert big.choice.estimate.latency_ms < p.choice.estimate.latency_ms


def test_fpga_plan_refuses_a_model_the_fabric_cannot_hold_with_figures(mnv2_stats):
    """MobileNetV2 at 96x96 (2.2 M weights) does not fit a PYNQ-Z2 at any reuse factor: the plan says so before
    anything is built, with the resources needed and available."""
    with pytest.raises(PlanError) as e:
        choose(None, load_board("xilinx/pynq-z2"), "fpga", stats=mnv2_stats, use_calibration=False)
    msg = str(e.value)
    assert "the fabric cannot hold it even at reuse factor 1024" in msg
    assert re.search(r"[\d,]+ BRAM36 of 140", msg) and "LUT of 53,200" in msg
    assert "choose a larger FPGA board" in msg
