"""FPGA target: brevitas PTQ (power-of-two) -> QONNX -> hls4ml C simulation, bit-exact.

Real toolchains on the FPGA-sized digits models (examples/digits_fpga) and real digits data.
Only the PYNQ overlay cannot run here (no board, no bitstream): smoke.py is exercised with a
``FakeFabricDriver`` that computes with QONNX execution of the bundle's own model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.errors import UnsupportedOpError, VerificationError
from edgekit.profiles import load_board, load_target

ROOT = Path(__file__).resolve().parents[1]
FPGA_EX = ROOT / "examples" / "digits_fpga"

pytest.importorskip("hls4ml")
pytest.importorskip("brevitas")
pytest.importorskip("qonnx")


# ---------------------------------------------------------------- profiles


@pytest.mark.parametrize(
    "board,lut,ff,bram,uram,dsp",
    [
        ("xilinx/pynq-z2", 53200, 106400, 140, 0, 220),
        ("xilinx/kv260", 117120, 234240, 144, 64, 1248),
        ("xilinx/zcu104", 230400, 460800, 312, 96, 1728),
    ],
)
def test_boards_carry_datasheet_figures(board, lut, ff, bram, uram, dsp):
    b = load_board(board)
    f = b.fpga
    assert (f.lut, f.ff, f.bram36, f.uram, f.dsp) == (lut, ff, bram, uram, dsp)
    assert "fpga" in b.targets and b.precisions == ["int8", "int4"]
    # peak int8 = DSP x fabric clock x 2 ops (1 MAC per DSP per clock), as the TOML comments say
    for mode in b.power_modes.values():
        assert mode.peak_tops["int8"] == pytest.approx(dsp * f.fabric_clock_mhz * 1e6 * 2 / 1e12, rel=0.01)
    assert (f.hls4ml_board is not None) == (board == "xilinx/pynq-z2")


def test_fpga_target_profile():
    t = load_target("fpga")
    assert t.converter == "hls4ml" and t.runner == "pynq" and t.extra == "fpga"
    assert t.default_board == "xilinx/pynq-z2"


# ---------------------------------------------------------------- resource estimate


def test_reuse_factor_is_smallest_that_fits():
    from edgekit import fabric as fr

    fpga = load_board("xilinx/pynq-z2").fpga
    costs = [fr.FabricLayer("fc1", 64 * 32, 8, 8, 32), fr.FabricLayer("fc2", 32 * 10, 8, 8, 10)]
    est, tried = fr.pick_reuse(costs, fpga, io_stream=False)
    assert est.fits and est.reuse_factor == tried[-1].reuse_factor
    assert all(not t.fits for t in tried[:-1])
    assert [t.lut for t in tried] == sorted((t.lut for t in tried), reverse=True)  # more reuse, fewer LUTs
    # >= 9-bit operands go to DSPs: one per weight per reuse factor
    wide = [fr.FabricLayer("fc", 100, 16, 16, 10)]
    assert fr.estimate(wide, 4, fpga, False).dsp == 25
    # a model far beyond the fabric never fits and says which resource binds
    huge = [fr.FabricLayer("fc", 4096 * 4096, 8, 8, 4096)]
    est, _ = fr.pick_reuse(huge, fpga, io_stream=False, choices=(1, 2, 4))
    assert not est.fits and est.limiting is not None
    assert "estimate" in est.to_json()["kind"]


# ---------------------------------------------------------------- front end


def test_help_does_not_import_hls4ml():
    code = "import sys, edgekit.cli; bad=[m for m in ('hls4ml','brevitas','qonnx','torch') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- the real chain (MLP, pynq-z2)


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory):
    from edgekit.pipeline import convert

    out = tmp_path_factory.mktemp("fpga") / "mlp"
    res = convert(FPGA_EX / "digits_mlp.pt2", target="fpga", board="xilinx/pynq-z2", precision="int8",
                  calib=str(ROOT / "examples/digits/calib.npz"), eval_data=str(ROOT / "examples/digits/eval.npz"),
                  out=out)
    return res


def test_mlp_int8_bit_exact_and_accurate(mlp_bundle):
    man = mlp_bundle.manifest
    art = man["artifact"]
    be = art["bit_exact"]
    # 64 calibration samples in convert + 1 load-and-run check + 64 golden (the default, drawn across eval)
    # + 450 eval samples in verify, all bit-exact
    assert be["samples"] == 64 + 1 + 64 + 450 and be["exact"] == be["samples"] and be["max_abs_diff"] == 0.0
    assert all(q["pow2"] for q in art["quantization"]["quant_nodes"])
    v = mlp_bundle.verification
    assert v.passed and v.converted_accuracy >= v.float_accuracy - 0.02
    # per-layer precision: no layer kept the 16,6 default, the input takes the input quantizer's type
    assert not any(p.startswith("fixed<16,6") for p in art["precisions"].values())
    assert art["precisions"]["global_in"].startswith("ufixed<8,0")
    assert art["backend"] == "VivadoAccelerator" and art["io_type"] == "io_parallel"


def test_mlp_bundle_contents(mlp_bundle):
    out = mlp_bundle.out_dir
    man = mlp_bundle.manifest
    for f in ("build.sh", "smoke.py", "run.py", "fabric_driver.py", "model.qonnx.onnx", "fabric_golden.npz",
              "resources.json", "hls/build_prj.tcl", "hls/design.tcl", "hls/axi_stream_driver.py",
              "hls/firmware/edgekit_fabric.cpp"):
        assert (out / f).is_file(), f
        assert f in man["files"]
    assert not list(out.rglob("*.so")), "the host's compiled C simulation must not ship"
    bit = man["artifact"]["bitstream"]
    assert bit["built"] is False and "Vivado" in bit["reason"]
    assert not list(out.glob("*.bit"))
    res = json.loads((out / "resources.json").read_text())
    assert res["chosen"]["fits"] and "ESTIMATE" in res["note"]
    assert res["chosen"]["reuse_factor"] == man["artifact"]["reuse_factor"]
    assert any("ESTIMATE" in n for n in man["notes"])


class FakeFabricDriver:
    """Stands in for the PYNQ overlay (no board here): QONNX execution of the bundle's model."""

    def __init__(self, bundle: Path, offset: float = 0.0) -> None:
        from qonnx.core.modelwrapper import ModelWrapper

        self.mw = ModelWrapper(str(bundle / "model.qonnx.onnx"))
        self.shape = [d if d > 0 else 1 for d in self.mw.get_tensor_shape(self.mw.graph.input[0].name)]
        self.offset = offset
        self.name = "FakeFabricDriver (qonnx execution)"

    def infer(self, x):
        from edgekit.converters.fpga.quant import qonnx_execute

        return qonnx_execute(self.mw, np.asarray(x, np.float32).reshape(self.shape)).reshape(-1) + self.offset


def _load_smoke(bundle: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("fpga_smoke_under_test", bundle / "smoke.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_on_host(mlp_bundle, tmp_path):
    bundle = mlp_bundle.out_dir
    smoke = _load_smoke(bundle)
    # the real loader: no pynq / no bitstream on this host -> a failed load check, exit 1
    rc = smoke.main(["--bundle", str(bundle), "--output", str(tmp_path / "r0.json")])
    r0 = json.loads((tmp_path / "r0.json").read_text())
    assert rc == 1 and not r0["passed"]
    assert [c["name"] for c in r0["checks"]] == ["integrity", "load"] and r0["checks"][0]["passed"]
    # the fabric's arithmetic stood in by QONNX execution: every golden vector comes back exactly
    rc = smoke.main(["--bundle", str(bundle), "--iters", "5", "--warmup", "1", "--output", str(tmp_path / "r1.json")],
                    driver=FakeFabricDriver(bundle))
    r1 = json.loads((tmp_path / "r1.json").read_text())
    checks = {c["name"]: c for c in r1["checks"]}
    assert list(checks) == ["integrity", "load", "golden", "latency", "memory", "power"]
    assert checks["golden"]["passed"] and checks["golden"]["bit_exact"] == checks["golden"]["samples"] == 16
    # the host stand-in is slower and bigger than the board budgets: those checks judge, rc follows them
    assert rc == (0 if all(c["passed"] is not False for c in r1["checks"]) else 1) and r1["passed"] == (rc == 0)
    assert set(r1["latency_ms"]) >= {"p50", "p90", "p99"}
    # one LSB off is a failure
    rc = smoke.main(["--bundle", str(bundle), "--iters", "2", "--warmup", "0", "--output", str(tmp_path / "r2.json")],
                    driver=FakeFabricDriver(bundle, offset=2.0**-12))
    r2 = json.loads((tmp_path / "r2.json").read_text())
    assert rc == 1 and not r2["passed"]
    assert next(c for c in r2["checks"] if c["name"] == "golden")["passed"] is False


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_mismatch_names_the_first_layer(tmp_path):
    """Corrupt the QONNX reference's first bias after compiling: the runner must fail at that layer."""
    from edgekit.converters import ConvertJob, get_converter
    from edgekit.data import load_npz
    from edgekit.ingest import load_model

    m = load_model(FPGA_EX / "digits_mlp.pt2")
    calib = load_npz(ROOT / "examples/digits/calib.npz", m)
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    job = ConvertJob(model=m, target=load_target("fpga"), board=load_board("xilinx/zcu104"), precision="int4",
                     calib=calib, out_dir=tmp_path / "out", work_dir=tmp_path / "work", log=lambda s: None,
                     warn=lambda s: None)
    conv = get_converter("hls4ml")
    art = conv.convert(job)
    assert art.meta["backend"] == "Vitis" and art.meta["part"] == "xczu7ev-ffvc1156-2-e"
    assert 'set part "xczu7ev-ffvc1156-2-e"' in (tmp_path / "out/hls/project.tcl").read_text()
    run = conv.host_runner(job, art)
    run({"image": calib.inputs["image"][:2]})  # exact before the corruption
    mw = conv._compiled[str(tmp_path / "out")]["mw"]
    mm0 = next(n for n in mw.graph.node if n.op_type == "MatMul")
    add0 = next(n for n in mw.graph.node if n.op_type == "Add" and n.input[0] == mm0.output[0])
    bias_q = next(n for n in mw.graph.node if n.output[0] == add0.input[1])
    b = mw.get_initializer(bias_q.input[0])
    mw.set_initializer(bias_q.input[0], b + 0.5)
    with pytest.raises(VerificationError, match=f"not bit-exact.*starts at hls4ml layer Dense_{mm0.name}"):
        run({"image": calib.inputs["image"][:4]})


@pytest.mark.slow
def test_tiny_cnn_int4_kv260_bare_ip(tmp_path):
    from edgekit.pipeline import convert

    res = convert(FPGA_EX / "digits_tcnn.pt2", target="fpga", board="xilinx/kv260", precision="int4",
                  calib=str(ROOT / "examples/digits/calib.npz"), eval_data=str(ROOT / "examples/digits/eval.npz"),
                  out=tmp_path / "cnn")
    art = res.manifest["artifact"]
    assert art["io_type"] == "io_stream" and art["backend"] == "Vitis" and art["part"] == "xck26-sfvc784-2LV-c"
    assert art["bit_exact"]["exact"] == art["bit_exact"]["samples"] == 64 + 1 + 64 + 450
    assert res.verification.passed
    assert any("bare HLS IP" in n for n in res.manifest["notes"])


# ---------------------------------------------------------------- lookup-table heads and the resource refusal


def _digits_mlp(tmp_path, head, hidden=32, train=True):
    """A digits MLP trained here on scikit-learn digits, with ``head`` (softmax / sigmoid) after its logits."""
    import torch
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32).reshape(-1, 64)
    y = d.target.astype(np.int64)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x[:1200]), torch.from_numpy(y[:1200])
    for _ in range(150 if train else 0):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    model = torch.nn.Sequential(*net, head).eval()
    torch.export.save(torch.export.export(model, (torch.zeros(1, 64),)), tmp_path / "mlp.pt2")
    np.savez(tmp_path / "calib.npz", x=x[:300])
    np.savez(tmp_path / "eval.npz", x=x[1200:], label=y[1200:])
    return tmp_path / "mlp.pt2"


@pytest.mark.slow  # two C-sim compiles each: in the full run (pytest -m 'not zoo')
@pytest.mark.parametrize("head", ["softmax", "sigmoid"])
def test_table_activation_head_on_the_fabric(tmp_path, head):
    """Softmax / Sigmoid after the logits run on the fabric as hls4ml lookup tables: every layer before them is
    bit-exact (traced), the table's output within its resolution of the exact function, the class kept."""
    import torch

    from edgekit.converters.fpga.csim import TABLE_TOL
    from edgekit.pipeline import convert

    model = _digits_mlp(tmp_path, torch.nn.Softmax(dim=-1) if head == "softmax" else torch.nn.Sigmoid())
    res = convert(model, target="fpga", board="xilinx/pynq-z2", precision="int8", calib=str(tmp_path / "calib.npz"),
                  eval_data=str(tmp_path / "eval.npz"), out=tmp_path / "b")
    art = res.manifest["artifact"]
    assert [lay["kind"] for lay in art["layers"]][-1] == head
    tc = art["table_check"]
    op = {"softmax": "Softmax", "sigmoid": "Sigmoid"}[head]
    assert tc["op"] == op and tc["within"] == tc["samples"] >= 64 + 450
    assert 0 < tc["max_abs_diff"] <= TABLE_TOL[op]
    assert art["bit_exact"]["exact"] == art["bit_exact"]["samples"] == 4  # traced before the table
    v = res.verification
    assert v.passed, v.failures
    assert v.float_accuracy > 0.9 and 100 * (v.float_accuracy - v.converted_accuracy) <= 2.0


def test_model_too_large_for_the_board_is_refused_with_figures(tmp_path):
    import torch

    from edgekit.pipeline import convert

    # 600k 8-bit weights need ~130 BRAM36 even at the largest reuse factor: beyond the 80% usable of 140
    model = _digits_mlp(tmp_path, torch.nn.Identity(), hidden=8192, train=False)
    with pytest.raises(UnsupportedOpError, match=r"does not fit xilinx/pynq-z2: .* \d+ BRAM36.* 140 BRAM36.*bram36 over"):
        convert(model, target="fpga", board="xilinx/pynq-z2", precision="int8", calib=str(tmp_path / "calib.npz"),
                out=tmp_path / "b")
    assert not (tmp_path / "b").exists()
