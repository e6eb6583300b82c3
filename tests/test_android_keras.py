"""Keras / SavedModel input on the android target: a small Keras CNN trained here on
scikit-learn's digits (real data, offline), saved as .keras and as a SavedModel, converted by
TensorFlow's real TFLiteConverter, verified in the real LiteRT interpreter, bundle run.py on
the host. Skipped where TensorFlow (``edgekit[keras]``) is not installed."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytest.importorskip("ai_edge_litert")
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from edgekit import deps
from edgekit.errors import EdgekitError, InputSpecError, MissingToolchainError, ModelLoadError  # noqa: E402
from edgekit.pipeline import convert  # noqa: E402


@pytest.fixture(scope="module")
def kd(tmp_path_factory):
    """A Keras CNN (conv-BN-ReLU, strided conv, dense) trained 12 epochs on digits (~5 s), NHWC data."""
    from keras_digits import train_and_save

    kd = train_and_save(tmp_path_factory.mktemp("keras"))
    assert kd["accuracy"] > 0.95, kd["accuracy"]
    kd["calib_nchw"] = kd["calib"].with_name("calib_nchw.npz")  # as examples/digits/calib.npz
    np.savez(kd["calib_nchw"], image=np.load(kd["calib"])["image"].transpose(0, 3, 1, 2))
    return kd


@pytest.fixture(scope="module")
def keras_int8(kd, tmp_path_factory):
    return convert(str(kd["keras"]), "android", tmp_path_factory.mktemp("k8") / "o", precision="int8",
                   calib=str(kd["calib"]), eval_data=str(kd["eval"]))


@pytest.fixture(scope="module")
def sm_int8_float_io(kd, tmp_path_factory):
    return convert(str(kd["saved_model"]), "android", tmp_path_factory.mktemp("s8") / "o", precision="int8",
                   calib=str(kd["calib"]), eval_data=str(kd["eval"]), options={"io": "float"})


def test_ingest_keras_and_saved_model(kd):
    from edgekit.ingest import load_model

    for key, kind in (("keras", "keras"), ("saved_model", "saved_model")):
        m = load_model(kd[key])
        assert m.kind == kind and m.is_tf and not m.is_torch
        assert [(s.shape, s.dtype, s.layout) for s in m.inputs] == [((1, 8, 8, 1), "float32", "nhwc")]
        assert m.outputs[0].shape == (1, 10)
        x = np.load(kd["eval"])["image"][:1]
        ref = m.reference()({m.inputs[0].name: x})[0]
        km = keras.models.load_model(kd["keras"], compile=False)
        np.testing.assert_allclose(ref, km(x, training=False).numpy(), atol=1e-5)


def test_int8_full_integer_int8_io_no_transpose(keras_int8):
    art = keras_int8.manifest["artifact"]
    assert art["converter"] == "TensorFlow TFLiteConverter" and art["full_integer"] is True
    assert art["float_ops"] == [] and "QUANTIZE" not in art["op_counts"] and "DEQUANTIZE" not in art["op_counts"]
    assert art["op_counts"] == {"CONV_2D": 2, "RESHAPE": 1, "FULLY_CONNECTED": 1}
    assert art["transpose"] == {"total": 0, "at_edges": 0, "interior": 0}  # NHWC model: nothing to transpose
    for t in art["io"]["inputs"] + art["io"]["outputs"]:
        assert t["dtype"] == "int8" and t["scale"] > 0 and -128 <= t["zero_point"] <= 127
    assert art["io"]["inputs"][0]["shape"] == [1, 8, 8, 1]
    assert art["layout"] == "source" and art["source_layout"] == "nhwc"
    assert art["quantization"]["calibration_batches"] == 200
    # TensorFlow under the one distribution that brought it (edgekit[keras]: tensorflow; a user's tensorflow-cpu)
    assert [d for d in deps.TF_DISTS if d in art["toolchain"]] == [deps.tensorflow_dist()], art["toolchain"]
    assert art["toolchain"][deps.tensorflow_dist()] == deps.tensorflow_version() and "keras" in art["toolchain"]
    assert keras_int8.manifest["source_model"]["kind"] == "keras"
    assert keras_int8.manifest["inputs"][0]["layout"] == "nhwc"


def test_int8_accuracy_within_one_point(keras_int8):
    v = keras_int8.verification
    assert v.passed, v.failures
    assert v.eval_samples == 450 and v.float_accuracy > 0.95
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0
    assert v.outputs[0].top1_agreement >= 0.9


def test_saved_model_int8_with_float_io(sm_int8_float_io):
    art = sm_int8_float_io.manifest["artifact"]
    assert [t["dtype"] for t in art["io"]["inputs"] + art["io"]["outputs"]] == ["float32", "float32"]
    assert art["full_integer"] and art["float_ops"] == [] and art["transpose"]["total"] == 0
    assert art["op_counts"]["QUANTIZE"] == 1 and art["op_counts"]["DEQUANTIZE"] == 1
    assert art["int8_io"]["inputs"][0]["dtype"] == "int8" and art["int8_io"]["inputs"][0]["scale"] > 0
    v = sm_int8_float_io.verification
    assert v.passed and 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0
    assert sm_int8_float_io.manifest["source_model"]["kind"] == "saved_model"


@pytest.mark.parametrize("key", ["keras", "saved_model"])
def test_fp32_matches_tensorflow(kd, tmp_path, key):
    res = convert(str(kd[key]), "android", tmp_path / "fp32", precision="fp32", eval_data=str(kd["eval"]))
    v = res.verification
    assert v.passed and v.outputs[0].max_rel_error < 1e-4 and v.converted_accuracy == v.float_accuracy
    art = res.manifest["artifact"]
    assert art["io"]["inputs"][0]["dtype"] == "float32" and art["transpose"]["total"] == 0
    assert res.manifest["files"]["model.tflite"]["bytes"] > 3 * 10_000  # ~10k fp32 parameters
    # the analyze stage: the float .tflite's ops (BatchNorm folded into the first conv)
    a = res.manifest["analysis"]
    assert a["params"] == 9930 and a["weight_params"] == 144 + 4608 + 5120
    assert a["macs"] == 8 * 8 * 16 * 9 + 4 * 4 * 32 * 16 * 9 + 10 * 512
    assert a["ops"] == {"CONV_2D": 2, "FULLY_CONNECTED": 1, "RESHAPE": 1}


def test_plan_estimates_keras_layers_at_each_precision(kd):
    """The cost model counts the float .tflite's CONV_2D / FULLY_CONNECTED layers as weight layers."""
    from edgekit.costmodel import Candidate, estimate
    from edgekit.planner import model_stats as analyze_model
    from edgekit.profiles import load_board, load_target

    _, stats = analyze_model(str(kd["keras"]), load_target("android"))
    assert [lay.op_class for lay in stats.layers] == ["conv", "conv", "other", "gemm"]
    b = load_board("pixel-8")
    storage = {p: estimate(stats, b, Candidate(p, b.default_power_mode)).storage_mb for p in ("fp32", "int8")}
    assert storage["fp32"] == pytest.approx(4 * 9930 / 1e6)
    assert storage["int8"] == pytest.approx(storage["fp32"] / 4)


def test_bundle_runner_on_host(keras_int8):
    out = keras_int8.out_dir
    assert {"model.tflite", "run.py", "golden.npz"} <= set(keras_int8.manifest["files"])
    g = np.load(out / "golden.npz")
    assert g["input_0"].shape[1:] == (8, 8, 1)  # golden inputs in the model's own NHWC layout
    r = subprocess.run([sys.executable, str(out / "run.py"), "--iters", "20", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "smoke_result.json").read_text())
    checks = {c["name"]: c for c in res["checks"]}
    assert res["passed"] and checks["golden"]["passed"] and checks["integrity"]["passed"]


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from cli_in_process import run_cli  # tests/support (on sys.path from conftest)

    return run_cli(monkeypatch, capsys, *args)


def test_inspect_keras_op_report(kd, monkeypatch, capsys):
    code, out, err = _cli(monkeypatch, capsys, "inspect", str(kd["keras"]), "--target", "android", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["kind"] == "keras" and data["unsupported"] == [] and data["target"] == "android"
    assert [lay["op"] for lay in data["layers"]] == ["CONV_2D", "CONV_2D", "RESHAPE", "FULLY_CONNECTED"]
    assert data["peak_activation_bytes"] > 0 and data["macs"] > 0


def test_cli_errors_exit_2_one_line(kd, tmp_path, monkeypatch, capsys):
    cut = tmp_path / "cut.keras"
    cut.write_bytes(kd["keras"].read_bytes()[:4000])
    cases = [
        (["convert", str(cut), "-t", "android", "-p", "fp32"], "cut.keras: not a Keras archive"),
        (["convert", str(kd["keras"]), "-t", "android", "-p", "int8", "--calib", str(kd["calib_nchw"])],
         "expects [N, 8, 8, 1]"),
    ]
    for args, needle in cases:
        code, _, err = _cli(monkeypatch, capsys, *args, "-o", str(tmp_path / "o"))
        assert code == 2, (args, err)
        assert needle in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "o").exists()
    assert "looks NCHW" in _cli(monkeypatch, capsys, *cases[1][0], "-o", str(tmp_path / "o"))[2]


def test_truncated_keras_via_subprocess(kd, tmp_path):
    """The installed entry point (refused before TensorFlow is imported, so this is quick)."""
    cut = tmp_path / "cut.keras"
    cut.write_bytes(kd["keras"].read_bytes()[:-100])
    r = subprocess.run([sys.executable, "-m", "edgekit", "convert", str(cut), "-t", "android", "-o",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "re-save it" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_damaged_saved_model_and_h5(kd, tmp_path):
    from edgekit.ingest import load_model

    sm = tmp_path / "sm"
    sm.mkdir()
    (sm / "saved_model.pb").write_bytes(b"\x08\x01garbage")
    with pytest.raises(ModelLoadError, match="cannot load the SavedModel"):
        load_model(sm)
    h5 = tmp_path / "m.h5"
    h5.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="Keras cannot load"):
        load_model(h5)


def test_missing_tensorflow_names_the_extra(kd, monkeypatch):
    from edgekit.ingest import load_model

    monkeypatch.setitem(sys.modules, "tensorflow", None)  # as if TensorFlow were not installed
    with pytest.raises(MissingToolchainError, match=r"pip install 'edgekit\[keras\]'"):
        load_model(kd["keras"])


def test_layout_option_refused_for_keras(kd, tmp_path):
    with pytest.raises(EdgekitError, match="keeps the model's own layout"):
        convert(str(kd["keras"]), "android", tmp_path / "o", precision="fp32", options={"layout": "nhwc"})
    assert not (tmp_path / "o").exists()


def test_calib_wrong_shape_api(kd, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, image=np.zeros((10, 4, 4, 1), np.float32))
    with pytest.raises(InputSpecError, match=r"expects \[N, 8, 8, 1\]"):
        convert(str(kd["keras"]), "android", tmp_path / "o", precision="int8", calib=str(bad))


# ---------------------------------------------------------------- small pieces (no conversion)


def test_flag_option_one_parser():
    from edgekit.converters import flag_option

    for v in (True, "true", "1", 1, "yes", "on", "TRUE"):
        assert flag_option({"f": v}, "f") is True, v
    for v in (False, "false", "0", 0, "no", "off", None):
        assert flag_option({"f": v}, "f") is False, v
    assert flag_option(None, "f") is False and flag_option({}, "f") is False
    with pytest.raises(EdgekitError, match="expected true or false"):
        flag_option({"f": "maybe"}, "f")


def test_quiet_restores_root_logger():
    from edgekit.quiet import quiet_python as _quiet

    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        with _quiet():
            assert root.level == logging.ERROR
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)


def test_op_without_int8_kernel_refused_then_allowed(tmp_path, monkeypatch, capsys):
    """SIN has no int8 TFLite kernel: inspect lists it, int8 refuses it, allow_float_fallback=yes keeps it float."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,), name="x")
    h = keras.layers.Lambda(lambda t: keras.ops.sin(t))(keras.layers.Dense(8)(inp))
    sm = tmp_path / "sin_sm"
    keras.Model(inp, keras.layers.Dense(1)(h)).export(str(sm), verbose=False)
    code, out, _ = _cli(monkeypatch, capsys, "inspect", str(sm), "--target", "android")
    assert code == 1 and "SIN" in out
    with pytest.raises(EdgekitError, match="SIN .*allow_float_fallback=true"):
        convert(str(sm), "android", tmp_path / "o", precision="int8", calib="random")
    res = convert(str(sm), "android", tmp_path / "o", precision="int8", calib="random",
                  options={"allow_float_fallback": "yes"})  # the one flag parser: "yes" is true everywhere
    art = res.manifest["artifact"]
    assert art["full_integer"] is False and "SIN" in {o["op"] for o in art["float_ops"]}
    assert res.verification.passed and any("stay float" in w for w in res.warnings)


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_keras_and_saved_model_reach_jetson_and_ios_through_onnx(kd, tmp_path):
    """TensorFlow models for the targets whose converters read ONNX / torch go through tf2onnx (edgekit.tf_bridge):
    the jetson INT8 build keeps digits accuracy within a point of Keras's own, the iOS fp16 build from the
    SavedModel verifies; names, NHWC layout and the bridge are what the manifest records."""
    pytest.importorskip("tf2onnx")
    pytest.importorskip("onnxruntime")
    j = convert(str(kd["keras"]), "jetson", tmp_path / "j", precision="int8", calib=str(kd["calib"]),
                eval_data=str(kd["eval"]), cache=False)
    v = j.verification
    assert v.passed and v.eval_samples == 450, v.failures
    assert abs(v.float_accuracy - kd["accuracy"]) < 1e-9  # the float reference is the Keras model's accuracy
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0, (v.float_accuracy, v.converted_accuracy)
    src = j.manifest["source_model"]
    assert src["kind"] == "keras" and src["bridge"].startswith("tf2onnx "), src
    assert [(i["name"], i["shape"], i.get("layout")) for i in j.manifest["inputs"]] == [("image", [1, 8, 8, 1], "nhwc")]
    pytest.importorskip("coremltools")
    i = convert(str(kd["saved_model"]), "ios", tmp_path / "i", precision="fp16", eval_data=str(kd["eval"]),
                cache=False)
    assert i.verification.passed, i.verification.failures
    src = i.manifest["source_model"]
    assert src["kind"] == "saved_model" and src["bridge"].startswith("tf2onnx ") and "onnx2torch" in src["bridge"], src
    assert i.verification.converted_accuracy >= i.verification.float_accuracy - 0.005


def test_keras_bridge_missing_or_wrong_is_one_line(kd, tmp_path, monkeypatch):
    """Without tf2onnx the error names the extra; a translation that computes something else is refused, not
    verified against itself."""
    from edgekit.errors import UnsupportedOpError

    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    with pytest.raises(MissingToolchainError, match=r"edgekit\[keras\]"):
        convert(str(kd["keras"]), "jetson", tmp_path / "a", precision="fp32", cache=False)
    monkeypatch.undo()
    pytest.importorskip("tf2onnx")
    import edgekit.tf_bridge as tb

    real = tb._rename

    def swap_outputs_sign(proto, old, new):  # a bridge bug: the graph output negated
        real(proto, old, new)
        g = proto.graph
        if new and new == [o.name for o in g.output]:
            import onnx

            name = g.output[0].name
            for node in g.node:
                for k, n in enumerate(node.output):
                    if n == name:
                        node.output[k] = name + "_pre"
            g.node.append(onnx.helper.make_node("Neg", [name + "_pre"], [name]))

    monkeypatch.setattr(tb, "_rename", swap_outputs_sign)
    with pytest.raises(UnsupportedOpError, match="differently from TensorFlow"):
        convert(str(kd["keras"]), "jetson", tmp_path / "b", precision="fp32", cache=False)
    assert not (tmp_path / "b").exists()


def test_int8_failure_on_keras_input_says_why_no_layer_was_searched(kd, tmp_path):
    """TFLiteConverter quantizes a Keras model whole: a failed INT8 build is not searched for layers to keep
    float (it once ended in a misleading litert-torch error); it fails with the reason and the way out."""
    res = convert(str(kd["keras"]), "android", tmp_path / "o", precision="int8", calib=str(kd["calib"]),
                  eval_data=str(kd["eval"]), tolerance={"max_rel_error": 1e-6, "abs_floor": 0.0,
                                                          "max_error_decides": True},
                  fail_on_verification=False)
    assert not res.verification.passed
    mp = res.manifest["artifact"]["mixed_precision"]
    assert mp["searched"] is False and "--option keras=onnx" in mp["reason"] and not mp["passed_after"]
    assert "not searched" in (res.out_dir / "report.md").read_text()


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_keras_through_onnx_on_android_takes_pt2e_and_mixed_precision(kd, tmp_path):
    """--option keras=onnx: the Keras model reaches android through tf2onnx and onnx2torch, is quantized by PT2E
    (per-channel weights, the observer measured), keeps digits accuracy within a point, and where INT8 fails a
    tight tolerance the mixed-precision search runs (it could not on the TFLiteConverter path)."""
    pytest.importorskip("tf2onnx")
    res = convert(str(kd["keras"]), "android", tmp_path / "o", precision="int8", calib=str(kd["calib"]),
                  eval_data=str(kd["eval"]), options={"keras": "onnx"}, cache=False)
    v = res.verification
    assert v.passed, v.failures
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0, (v.float_accuracy, v.converted_accuracy)
    src = res.manifest["source_model"]
    assert src["kind"] == "keras" and src["bridge"].startswith("tf2onnx ") and "onnx2torch" in src["bridge"], src
    assert res.manifest["artifact"]["quantization"]["tool"] == "litert-torch PT2E static"
    tight = convert(str(kd["keras"]), "android", tmp_path / "t", precision="int8", calib=str(kd["calib"]),
                    eval_data=str(kd["eval"]), options={"keras": "onnx"}, cache=False, fail_on_verification=False,
                    tolerance={"max_rel_error": 1e-6, "abs_floor": 0.0, "max_error_decides": True})
    assert not tight.verification.passed  # no INT8 build is within 1e-6 of float
    mp = tight.manifest["artifact"].get("mixed_precision")
    assert mp is not None and mp.get("searched", True) is not False and mp["scanned"], mp


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_finetune_takes_a_keras_model_through_onnx_and_convert_measures_it_against_the_keras_file(kd, tmp_path):
    """A Keras model has no trainable graph in TensorFlow here: finetune writes it to ONNX (tf2onnx, checked against
    TensorFlow), rebuilds it in torch (onnx2torch) and trains that; the output is a .pt2 with the Keras model's NHWC
    input. Its android INT8 build is then measured against the .keras file itself (read in Keras' safe mode)."""
    from edgekit.finetune import finetune
    from edgekit.ingest import load_model
    from edgekit.lineage import read_record

    res = finetune(str(kd["keras"]), kd["calib"], tmp_path / "ft.pt2", target="android", epochs=4)
    assert res.loss_after < res.loss_before
    m = load_model(res.out)
    assert m.kind == "exported_program" and m.inputs[0].shape == (1, 8, 8, 1)
    assert read_record(res.out)["finetuned_from"]["sha256"] == load_model(kd["keras"]).sha256
    built = convert(str(res.out), "android", tmp_path / "o", precision="int8", calib=str(kd["calib"]),
                    eval_data=str(kd["eval"]), fail_on_verification=False)
    against = built.verification.against_original
    assert against is not None and against["from"] == "eval" and against["trained_on"] == 0
    assert against["model"] == str(kd["keras"])
    assert next(iter(against["outputs"].values()))["top1_agreement"] >= 0.95, against
