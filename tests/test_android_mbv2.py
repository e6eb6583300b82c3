"""Android / LiteRT on a MobileNetV2-shaped network (inverted residual blocks, depthwise
convolutions, residual ADDs that feed the next ADD): real litert-torch conversion, real LiteRT
interpreter. The model is examples/mbv2_digits/mbv2.pt2 (trained on scikit-learn's digits by
bench/android_nets.py); its calibration and eval data are regenerated from scikit-learn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

from edgekit.errors import ConversionError  # noqa: E402
from edgekit.pipeline import convert  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "mbv2_digits" / "mbv2.pt2"
sys.path.insert(0, str(ROOT / "bench"))
import android_nets  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    calib, ev = android_nets.write_data(tmp_path_factory.mktemp("mbv2data"))
    return {"calib": str(calib), "eval": str(ev)}


@pytest.fixture(scope="module")
def int8_build(data, tmp_path_factory):
    return convert(MODEL, "android", tmp_path_factory.mktemp("mbv2") / "int8", precision="int8",
                   calib=data["calib"], eval_data=data["eval"])


def test_mbv2_int8_is_full_integer(int8_build):
    art = int8_build.manifest["artifact"]
    assert art["full_integer"] and art["float_ops"] == []
    assert art["op_counts"]["ADD"] == 4 and art["op_counts"]["DEPTHWISE_CONV_2D"] == 5
    assert "DEQUANTIZE" not in art["op_counts"] and "QUANTIZE" not in art["op_counts"]
    # the stock annotator misses the residual ADDs; edgekit annotates them
    assert art["quantization"]["add_mul_annotated_by_edgekit"] >= 3
    assert [t["dtype"] for t in art["io"]["inputs"] + art["io"]["outputs"]] == ["int8", "int8"]


def test_mbv2_transpose_only_at_the_input(int8_build):
    tr = int8_build.manifest["artifact"]["transpose"]
    assert tr == {"total": 1, "at_edges": 1, "interior": 0}


def test_mbv2_int8_accuracy_and_agreement(int8_build):
    v = int8_build.verification
    assert v.passed, v.failures
    assert v.float_accuracy > 0.95
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0
    assert v.outputs[0].top1_agreement >= 0.9


def test_stock_litert_quantizer_leaves_float_adds_and_audit_catches_them(data, tmp_path):
    """The bug edgekit works around, on the same model: litert-torch's default PT2E config."""
    import numpy as np
    import torch
    import litert_torch
    from litert_torch.quantize import pt2e_quantizer as pq
    from litert_torch.quantize import quant_config as qc
    from torchao.quantization.pt2e import quantize_pt2e

    from edgekit.converters.tflite.audit import audit, format_float_ops

    calib = np.load(data["calib"])["image"]
    gm = torch.export.load(str(MODEL)).module()
    q = pq.PT2EQuantizer().set_global(pq.get_symmetric_quantization_config(is_per_channel=True))
    gm = quantize_pt2e.prepare_pt2e(gm, q)
    with torch.no_grad():
        for i in range(32):
            gm(torch.from_numpy(calib[i : i + 1]))
    gm = quantize_pt2e.convert_pt2e(gm, fold_quantize=False)
    sample = (torch.from_numpy(calib[:1]),)
    litert_torch.convert(gm, sample, quant_config=qc.QuantConfig(pt2e_quantizer=q)).export(str(tmp_path / "s.tflite"))
    rep = audit(tmp_path / "s.tflite")
    float_ops = {o["op"] for o in rep["float_ops"]}
    assert "ADD" in float_ops and "DEQUANTIZE" in float_ops
    assert "InvertedResidual" in format_float_ops(rep["float_ops"])  # names the node that made it


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_mbv2_nhwc_layout_has_no_transpose(data, tmp_path):
    res = convert(MODEL, "android", tmp_path / "nhwc", precision="int8", calib=data["calib"],
                  options={"layout": "nhwc"})
    art = res.manifest["artifact"]
    assert art["transpose"]["total"] == 0 and art["full_integer"]
    assert art["io"]["inputs"][0]["shape"] == [1, 16, 16, 3]
    assert res.verification.passed, res.verification.failures
    r = subprocess.run([sys.executable, str(res.out_dir / "run.py"), "--iters", "10"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((res.out_dir / "smoke_result.json").read_text())["passed"]


SIN_NET = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.l = torch.nn.Linear(8, 10)
    def forward(self, image):
        x = torch.sin(self.c(image))  # SIN: TFLite has no int8 kernel for it
        return self.l(x.mean(dim=(2, 3)))
def make():
    torch.manual_seed(0)
    return M()
"""


def test_float_op_fails_full_integer_unless_allowed(tmp_path, monkeypatch):
    from edgekit.converters import ConvertJob
    from edgekit.converters.tflite.converter import CONVERTER
    from edgekit.data import random_dataset
    from edgekit.errors import UnsupportedOpError
    from edgekit.ingest import load_model
    from edgekit.profiles import default_board, load_target

    (tmp_path / "sin_android.py").write_text(SIN_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    # before converting: the op report names the node that cannot be integer
    with pytest.raises(UnsupportedOpError, match="Sin"):
        convert("sin_android:make", "android", tmp_path / "o", precision="int8", calib="random",
                input_shape=["1,3,16,16"])
    assert not (tmp_path / "o").exists()
    # after converting: the audit of the .tflite finds the float op and refuses the build
    m = load_model("sin_android:make", ["1,3,16,16"])
    (tmp_path / "job").mkdir()
    job = ConvertJob(model=m, target=load_target("android"), board=default_board("android"), precision="int8",
                     calib=random_dataset(m, n=16), out_dir=tmp_path / "job", work_dir=tmp_path, log=lambda s: None,
                     warn=lambda s: None)
    with pytest.raises(ConversionError, match=r"SIN.*allow_float_fallback"):
        CONVERTER.convert(job)
    # allowed: the build goes through, marked not full-integer, with a warning
    res = convert("sin_android:make", "android", tmp_path / "o2", precision="int8", calib="random",
                  input_shape=["1,3,16,16"], options={"allow_float_fallback": True})
    art = res.manifest["artifact"]
    assert not art["full_integer"] and "SIN" in {o["op"] for o in art["float_ops"]}
    assert any("stay float" in w for w in res.warnings)
