"""Keras 2 input: .h5 files and a SavedModel written by tf-keras itself (in a child process with
TF_USE_LEGACY_KERAS=1, tests/support/keras2_digits.py), trained on scikit-learn's digits, read by edgekit with
tf-keras (edgekit.keras2) and converted for every target with the real toolchains. Skipped where tf-keras
(``edgekit[keras]``) is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")
keras = pytest.importorskip("keras")

from edgekit.errors import ModelLoadError, UnsupportedOpError
from edgekit.ingest import load_model
from edgekit.pipeline import convert

WRITER = Path(__file__).resolve().parent / "support" / "keras2_digits.py"


@pytest.fixture(scope="module")
def k2(tmp_path_factory) -> dict[str, Path]:
    """The Keras 2 files (~15 s: a TensorFlow import and two small trainings in the child)."""
    out = tmp_path_factory.mktemp("keras2")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    r = subprocess.run([sys.executable, str(WRITER), str(out)], check=False, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    acc = [float(v) for v in r.stdout.split("ACCURACY", 1)[1].split()]
    assert acc[0] > 0.85 and acc[1] > 0.9, acc
    return {p.stem if p.is_file() else p.name: p for p in out.iterdir()}


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from cli_in_process import run_cli  # tests/support (on sys.path from conftest)

    return run_cli(monkeypatch, capsys, *args)


def test_keras3_refuses_the_h5_and_edgekit_reads_it_with_tf_keras(k2):
    with pytest.raises(Exception, match="DepthwiseConv2D"):  # the premise: Keras 3 cannot read this file
        keras.models.load_model(k2["cnn"], compile=False)
    ref = np.load(k2["ref"])
    x = np.load(k2["eval"])["image"][:8]
    for key, kind in (("cnn", "keras"), ("cnn_sm", "saved_model")):
        m = load_model(k2[key])
        assert m.kind == kind and m.is_tf
        assert [(s.name, s.shape, s.dtype, s.layout) for s in m.inputs] == [("image", (1, 8, 8, 1), "float32", "nhwc")]
        assert m.outputs[0].shape == (1, 10)
        got = np.concatenate([m.reference()({"image": x[i:i + 1]})[0] for i in range(8)])
        np.testing.assert_allclose(got, ref["cnn"], rtol=1e-5, atol=1e-5)
    assert type(load_model(k2["cnn"]).tf_model).__module__.startswith("tf_keras")
    mlp = load_model(k2["mlp"])
    assert [(s.name, s.shape) for s in mlp.inputs] == [("x", (1, 64))]
    np.testing.assert_allclose(mlp.reference()({"x": np.load(k2["eval_flat"])["x"][:1]})[0], ref["mlp"][:1],
                               rtol=1e-5, atol=1e-5)


def test_lambda_in_a_keras2_h5_needs_trust_pickle(k2):
    """tf-keras deserializes a Lambda's Python from an .h5 even in safe_mode: edgekit refuses it from the config
    (before TensorFlow or tf-keras reads the file) unless trusted."""
    with pytest.raises(ModelLoadError, match=r"Lambda layer\(s\) lambda .*--trust-pickle"):
        load_model(k2["lambda"])
    m = load_model(k2["lambda"], trust_pickle=True)
    x = np.ones((1, 64), np.float32)
    assert m.reference()({"x": x})[0].shape == (1, 10)


def test_android_fp32_from_keras2_h5_with_the_cli(k2, tmp_path, monkeypatch, capsys):
    code, _, err = _cli(monkeypatch, capsys, "convert", str(k2["cnn"]), "--target", "android", "-p", "fp32",
                        "--eval", str(k2["eval"]), "-o", str(tmp_path / "o"))
    assert code == 0, err
    import json

    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert man["source_model"]["kind"] == "keras" and man["verification"]["passed"], man["verification"]
    assert "tf-keras" in man["artifact"]["toolchain"], man["artifact"]["toolchain"]


def test_missing_tf_keras_names_the_cause_and_the_extra(k2, monkeypatch):
    """Without tf-keras, Keras 3 is tried and its refusal says that the file is a Keras 2 one and what reads it."""
    monkeypatch.setitem(sys.modules, "tf_keras", None)  # as if tf-keras were not installed
    with pytest.raises(ModelLoadError) as exc:
        load_model(k2["cnn"])
    msg = str(exc.value)
    assert "written by Keras 2.21.0 (tf.keras); Keras 3 cannot read it" in msg, msg
    assert "pip install 'edgekit[keras]'" in msg and "tf-keras" in msg and "re-save" not in msg, msg
    assert load_model(k2["mlp"]).kind == "keras"  # a Keras 2 file that Keras 3 does read still loads


def test_missing_tf_keras_for_a_keras2_saved_model(k2):
    """TensorFlow's SavedModel loader imports tf-keras itself for a saved Keras 2 optimizer, so its absence is shown
    in a fresh process (here the loader has registered tf-keras's optimizer already)."""
    code = ("import sys; sys.modules['tf_keras'] = None\n"
            "from edgekit.ingest import load_model\n"
            "from edgekit.errors import ModelLoadError\n"
            f"try:\n    load_model({str(k2['cnn_sm'])!r})\n"
            "except ModelLoadError as e:\n    print('REFUSED', e)\n")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert r.returncode == 0 and "REFUSED" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "written by Keras 2 (tf.keras) with its optimizer" in r.stdout and "edgekit[keras]" in r.stdout, r.stdout


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_keras2_files_reach_every_target(k2, tmp_path):
    """android INT8 from the SavedModel (TFLiteConverter), jetson INT8 from the .h5 and iOS fp16 from the
    SavedModel (tf2onnx), fpga INT8 from the .h5 MLP (tf2onnx, brevitas, hls4ml)."""
    pytest.importorskip("tf2onnx")
    a = convert(str(k2["cnn_sm"]), "android", tmp_path / "a", precision="int8", calib=str(k2["calib"]),
                eval_data=str(k2["eval"]), options={"io": "float"}, cache=False)
    assert a.verification.passed, a.verification.failures
    assert a.manifest["source_model"]["kind"] == "saved_model"
    pytest.importorskip("onnxruntime")
    j = convert(str(k2["cnn"]), "jetson", tmp_path / "j", precision="int8", calib=str(k2["calib"]),
                eval_data=str(k2["eval"]), cache=False)
    assert j.verification.passed, j.verification.failures
    src = j.manifest["source_model"]
    assert src["kind"] == "keras" and src["bridge"].startswith("tf2onnx "), src
    assert 100 * (j.verification.float_accuracy - j.verification.converted_accuracy) <= 2.0
    pytest.importorskip("coremltools")
    i = convert(str(k2["cnn_sm"]), "ios", tmp_path / "i", precision="fp16", eval_data=str(k2["eval"]), cache=False)
    assert i.verification.passed, i.verification.failures
    assert i.manifest["source_model"]["kind"] == "saved_model"
    pytest.importorskip("hls4ml")
    pytest.importorskip("brevitas")
    try:
        f = convert(str(k2["mlp"]), "fpga", tmp_path / "f", board="xilinx/pynq-z2", precision="int8",
                    calib=str(k2["calib_flat"]), eval_data=str(k2["eval_flat"]), cache=False)
    except UnsupportedOpError as exc:  # the fpga converter takes a narrow op set: a refusal is about ops
        assert "load" not in str(exc).lower() and "Keras 3" not in str(exc), exc
        pytest.fail(f"fpga refused the Keras 2 MLP: {exc}")
    assert f.verification.passed, f.verification.failures
    assert f.manifest["source_model"]["kind"] == "keras"
