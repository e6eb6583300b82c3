"""The Jetson path end to end on the host: convert, verify, bundle, run the device runner."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import InputSpecError, OutputError, ProfileError, UnsupportedOpError, VerificationError
from edgekit.fsutil import sha256_file
from edgekit.pipeline import convert
from edgekit.profiles import data_dir


@pytest.fixture(scope="module")
def builds(digits, tmp_path_factory):
    out = {}
    root = tmp_path_factory.mktemp("jetson")
    for p in ("fp32", "fp16", "int8"):
        out[p] = convert(digits["model"], "jetson", root / p, precision=p, calib=str(digits["calib"]),
                         eval_data=str(digits["eval"]))
    return out


def test_accuracy_float_vs_converted(builds):
    for p, res in builds.items():
        v = res.verification
        assert v.passed, v.failures
        assert v.eval_samples == 450
        assert v.float_accuracy > 0.95
        drop = v.float_accuracy - v.converted_accuracy
        assert drop <= {"fp32": 0.0, "fp16": 0.005, "int8": 0.02}[p] + 1e-9, (p, drop)


def test_onnx_is_loadable_with_opset_and_ir_onnxruntime_accepts(builds):
    for res in builds.values():
        proto = onnx.load(str(res.out_dir / "model.onnx"))
        onnx.checker.check_model(proto)
        opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
        assert opset >= 17
        assert proto.ir_version <= 10
        ort.InferenceSession(str(res.out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        assert {o.domain for o in proto.opset_import} <= {"", "ai.onnx"}  # nothing TensorRT cannot parse


def test_int8_is_explicit_symmetric_per_channel_qdq(builds):
    proto = onnx.load(str(builds["int8"].out_dir / "model.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    ops = [n.op_type for n in proto.graph.node]
    producers = {o: n for n in proto.graph.node for o in n.output}
    # TensorRT's placement: Q/DQ on the inputs of every Conv / Gemm, none on their outputs (the rest runs fp16)
    weighted = [n for n in proto.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(weighted) >= 3 and ops.count("QuantizeLinear") >= len(weighted)
    assert all(producers[n.input[0]].op_type == "DequantizeLinear" for n in weighted)
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in producers
                   and producers[n.input[0]].op_type in ("Conv", "Gemm") for n in proto.graph.node)
    assert all(len(n.input) < 3 or producers.get(n.input[2]) is None for n in weighted)  # float bias
    # every Conv / Gemm reads a dequantized int8 weight with one scale per output channel
    for n in proto.graph.node:
        if n.op_type in ("Conv", "Gemm"):
            dq = producers[n.input[1]]
            assert dq.op_type == "DequantizeLinear"
            w, scale = inits[dq.input[0]], inits[dq.input[1]]
            assert w.dtype == np.int8
            assert scale.size == w.shape[0] and scale.size > 1  # per-channel
            if len(dq.input) > 2:
                assert not inits[dq.input[2]].any()  # symmetric: zero point 0
    # activations: symmetric int8 (zero point 0)
    for n in proto.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            zp = inits[n.input[2]]
            assert zp.dtype == np.int8 and not zp.any()


def test_qdq_all_restores_onnxruntimes_every_op_placement(builds, digits, tmp_path):
    """--option qdq=all: Q/DQ also on the outputs of the quantized ops (onnxruntime's default), recorded."""
    res = convert(digits["model"], "jetson", tmp_path / "all", precision="int8", calib=str(digits["calib"]),
                  options={"qdq": "all", "calibration": "minmax"}, cache=False)
    q = res.manifest["artifact"]["quantization"]
    assert q["qdq_placement"] == "all" and builds["int8"].manifest["artifact"]["quantization"]["qdq_placement"] == "tensorrt"
    g = onnx.load(str(res.out_dir / "model.onnx")).graph
    producers = {o: n.op_type for n in g.node for o in n.output}
    assert any(n.op_type == "QuantizeLinear" and producers.get(n.input[0]) in ("Conv", "Gemm", "Relu", "Add")
               for n in g.node)
    assert q["quantize_linear"] > builds["int8"].manifest["artifact"]["quantization"]["quantize_linear"]


def test_size_ratios(builds):
    size = {p: r.manifest["files"]["model.onnx"]["bytes"] for p, r in builds.items()}
    assert size["fp16"] / size["fp32"] < 0.6
    assert size["int8"] / size["fp32"] < 0.45


def test_manifest_records_everything_and_hashes_match(builds, digits):
    res = builds["int8"]
    man = json.loads((res.out_dir / "manifest.json").read_text())
    for key in ("source_model", "precision", "calibration", "toolchain", "inputs", "outputs", "board", "budgets",
                "golden", "tolerance", "verification", "files", "artifact"):
        assert key in man, key
    assert man["source_model"]["sha256"] == sha256_file(digits["model"])
    assert man["calibration"]["sha256"] == sha256_file(digits["calib"])
    assert man["toolchain"]["onnxruntime"] == ort.__version__
    assert man["board"]["id"] == "nvidia/jetson-orin-nano-8gb"
    assert man["verification"]["passed"] is True
    for rel, info in man["files"].items():
        assert sha256_file(res.out_dir / rel) == info["sha256"], rel
    for needed in ("model.onnx", "golden.npz", "run.py", "edgekit_smoke.py", "build_engine.sh", "report.md"):
        assert needed in man["files"], needed
    assert man["artifact"]["engine"]["built"] is False and "tensorrt" in man["artifact"]["engine"]["reason"]
    g = np.load(res.out_dir / "golden.npz")
    assert g["input_0"].shape == (64, 1, 8, 8) and g["output_0"].shape == (64, 10)  # the default golden count
    assert "int8" in (res.out_dir / "report.md").read_text()


def _run_runner(bundle: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(bundle / "run.py"), "--runtime", "onnxruntime", "--iters", "20",
                           "--warmup", "2", *args], capture_output=True, text=True, timeout=120)


def test_device_runner_on_host_passes_and_writes_result(builds, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(builds["int8"].out_dir, bundle)
    proc = _run_runner(bundle)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((bundle / "smoke_result.json").read_text())
    assert res["passed"] is True
    names = {c["name"]: c for c in res["checks"]}
    assert names["integrity"]["passed"] and names["golden"]["passed"] and names["latency"]["passed"]
    assert names["power"]["passed"] is None and "not measured" in names["power"]["detail"]
    assert res["latency_ms"]["p50"] <= res["latency_ms"]["p99"]


def test_device_runner_catches_corruption_and_bad_outputs(builds, tmp_path):
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(builds["fp32"].out_dir, bundle)
    data = bytearray((bundle / "model.onnx").read_bytes())
    data[-10] ^= 0xFF
    (bundle / "model.onnx").write_bytes(bytes(data))
    proc = _run_runner(bundle)
    assert proc.returncode == 1
    assert "model.onnx: sha256 differs" in proc.stdout

    # golden outputs that the model does not produce (every class turned around): the golden check must fail
    shutil.rmtree(bundle)
    shutil.copytree(builds["fp32"].out_dir, bundle)
    g = dict(np.load(bundle / "golden.npz"))
    g["output_0"] = -g["output_0"]
    np.savez(bundle / "golden.npz", **g)
    man = json.loads((bundle / "manifest.json").read_text())
    man["files"]["golden.npz"]["sha256"] = sha256_file(bundle / "golden.npz")
    (bundle / "manifest.json").write_text(json.dumps(man))
    proc = _run_runner(bundle)
    assert proc.returncode == 1 and "FAIL golden" in proc.stdout


def test_device_runner_keeps_to_python36_syntax():
    for rel in ("tensorrt/run.py", "common/edgekit_smoke.py"):
        src = (data_dir("firmware") / rel).read_text()
        ast.parse(src, feature_version=(3, 6))
        assert "from __future__ import annotations" not in src


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_int8_needs_calibration_or_explicit_random(digits, tmp_path):
    with pytest.raises(InputSpecError, match="--calib"):
        convert(digits["model"], "jetson", tmp_path / "x", precision="int8")
    assert not (tmp_path / "x").exists()
    warnings = []
    res = convert(digits["model"], "jetson", tmp_path / "r", precision="int8", calib="random", warn=warnings.append)
    assert any("accuracy on real data is unknown" in w for w in warnings)
    assert res.manifest["calibration"]["random"] is True


def test_int8_refused_on_maxwell_nano(digits, tmp_path):
    with pytest.raises(ProfileError, match="no int8 compute path"):
        convert(digits["model"], "jetson", tmp_path / "x", board="nvidia/jetson-nano-4gb", precision="int8",
                calib=str(digits["calib"]))


def test_calibration_with_wrong_shape_names_expected(digits, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, image=np.zeros((4, 1, 28, 28), np.float32))
    with pytest.raises(InputSpecError, match=r"expects \[N, 1, 8, 8\]"):
        convert(digits["model"], "jetson", tmp_path / "x", precision="int8", calib=str(bad))


def _det_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    node = helper.make_node("Det", ["x"], ["y"], name="the_det")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_unsupported_op_names_op_and_node(tmp_path):
    with pytest.raises(UnsupportedOpError, match=r"Det \(node the_det\)"):
        convert(_det_model(tmp_path / "det.onnx"), "jetson", tmp_path / "x", precision="fp32")
    assert not (tmp_path / "x").exists()


def test_failed_verification_is_marked_and_raises(digits, tmp_path, monkeypatch):
    from edgekit import profiles

    real = profiles.load_target

    def strict(name):
        t = real(name)
        t.tolerances["fp16"].max_rel_error = 1e-9  # no fp16 build can meet this
        t.tolerances["fp16"].max_error_decides = True  # ... and it decides (the top-1 agreement passes)
        return t

    monkeypatch.setattr("edgekit.request.load_target", strict)
    with pytest.raises(VerificationError, match="output 'output': max error .*tolerance"):
        convert(digits["model"], "jetson", tmp_path / "v", precision="fp16", calib=str(digits["calib"]))
    man = json.loads((tmp_path / "v" / "manifest.json").read_text())
    assert man["verification"]["passed"] is False
    assert "FAILED" in (tmp_path / "v" / "report.md").read_text()


def test_a_worst_sample_over_the_bar_is_a_warning_where_agreement_passes(digits, tmp_path):
    """The digits classifier at fp16 with a max_rel_error no fp16 build meets: its top-1 agreement (the class
    output's task metric) passes, so the build passes and the CLI prints a warning naming the worst golden sample;
    the table says the pass carries a warned max error, and the manifest and report record it."""
    from typer.testing import CliRunner

    from edgekit.cli import app

    res = CliRunner().invoke(app, ["convert", str(digits["model"]), "--target", "jetson", "-p", "fp16", "--calib",
                                   str(digits["calib"]), "--tolerance", "max_rel_error=1e-9", "--tolerance",
                                   "abs_floor=0", "-o", str(tmp_path / "w"), "--no-cache"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())  # rich wraps long lines
    assert "warning: output 'output': max error" in out and "golden sample" in out, res.output
    assert "reported, not deciding: top-1 agreement 100.0% meets its bar" in out, res.output
    assert "pass, max error warned" in out and "FAIL" not in out, res.output
    man = json.loads((tmp_path / "w" / "manifest.json").read_text())
    o = man["verification"]["outputs"][0]
    assert man["verification"]["passed"] and o["passed"] and o["decided_by"] == ["top1_agreement"], o
    assert o["warnings"] and o["warnings"][0] in man["warnings"] and o["max_rel_error"] > 1e-9
    assert f"golden sample {o['worst_sample']}" in o["warnings"][0]
    assert man["tolerance"]["max_error_decides"] is False
    assert "pass (max error over its tolerance: warning" in (tmp_path / "w" / "report.md").read_text()


def test_output_is_atomic_and_never_clobbers_foreign_folders(digits, tmp_path, monkeypatch):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(OutputError, match="not an edgekit output"):
        convert(digits["model"], "jetson", foreign, precision="fp32")
    assert (foreign / "thesis.tex").read_text() == "precious"

    # a crash inside the convert stage leaves no output and no temporary sibling
    from edgekit.converters.tensorrt import converter as tensorrt

    def boom(self, job):
        (job.out_dir / "model.onnx").write_bytes(b"half")
        raise RuntimeError("killed")

    monkeypatch.setattr(tensorrt.TensorRTConverter, "convert", boom)
    with pytest.raises(RuntimeError, match="killed"):
        convert(digits["model"], "jetson", tmp_path / "out", precision="fp32")
    assert sorted(os.listdir(tmp_path)) == ["mine"]


@pytest.mark.gpu
def test_engine_builds_where_tensorrt_and_a_gpu_exist(builds, tmp_path):
    trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed (no GPU here; engines build on the board)")
    from edgekit.converters import load_firmware
    from edgekit.converters.tensorrt.engine import _engine_unavailable

    why = _engine_unavailable()
    if why:
        pytest.skip(why)
    runner = load_firmware("tensorrt")
    engine = tmp_path / "model.engine"
    runner.build_engine(str(builds["int8"].out_dir / "model.onnx"), str(engine), "int8",
                        timing_cache=str(tmp_path / "timing.cache"))
    assert engine.stat().st_size > 0 and trt.__version__


def test_host_board_is_worded_as_this_machine(digits, tmp_path):
    """With --board host the build is for this machine: its notes and report do not send the user to a board."""
    import importlib.util

    import pytest

    from edgekit.pipeline import convert

    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed: the engine is built here, there is no 'not built' note to word")
    res = convert(digits["model"], target="jetson", board="host", precision="fp32", out=tmp_path / "o", golden_count=8)
    engine = next(n for n in res.notes if n.startswith("TensorRT engine not built here"))
    assert "on the board" not in engine and "this machine" in engine
    report = (res.out_dir / "report.md").read_text()
    assert "This machine is the board" in report and "the host cannot measure them" not in report


def _shared_bias_model(path: Path) -> Path:
    """Three 3x3 convs sharing one weight and one bias initializer ``b`` (tf2onnx shares equal constants), the
    first one's output named ``b1``: the name quantize_static gave its second copy of ``b`` (a published pitch
    model's CQT front end, ``conv1d_25`` shared 18 times next to an activation ``conv1d_252``)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((2, 2, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(np.array([0.1, -0.2], np.float32), "b")
    nodes = [helper.make_node("Conv", [i, "w", "b"], [o], pads=[1, 1, 1, 1], name=f"conv{k}")
             for k, (i, o) in enumerate([("x", "b1"), ("b1", "h"), ("h", "y")])]
    g = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], [w, b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_int8_of_convs_sharing_a_bias_runs(tmp_path):
    """The Q/DQ model ran in onnxruntime as 'bias must be a 1D tensor of size output_channels' (a traceback):
    quantize_static's copy of a shared bias took an activation's name. Each conv gets its own bias first."""
    res = convert(_shared_bias_model(tmp_path / "shared.onnx"), "jetson", tmp_path / "o", precision="int8",
                  calib="random", cache=False)
    assert res.verification.passed, res.verification.failures
    q = onnx.load(str(res.out_dir / "model.onnx"))
    inits = {i.name for i in q.graph.initializer}
    biases = [n.input[2] for n in q.graph.node if n.op_type == "Conv"]
    assert len(set(biases)) == 3 and set(biases) <= inits
