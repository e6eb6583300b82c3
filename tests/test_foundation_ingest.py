"""Ingest every model kind; analysis numbers checked against torch and by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edgekit.analyze import analyze_onnx
from edgekit.errors import InputSpecError, ModelLoadError
from edgekit.ingest import load_model
from edgekit.onnx_graph import export_onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "digits"))
from train import DigitsCNN  # noqa: E402


class Chain(nn.Module):
    """conv(1->4, 3x3) -> relu -> conv(4->2, 1x1) on 1x1x6x6: small enough to count by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(1, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def chain_factory() -> nn.Module:
    torch.manual_seed(0)
    return Chain()


def test_exported_program_input_spec(digits):
    m = load_model(digits["model"])
    assert m.kind == "exported_program"
    assert [(s.name, s.shape, s.dtype) for s in m.inputs] == [("image", (1, 1, 8, 8), "float32")]
    assert m.outputs[0].shape == (1, 10)
    assert len(m.sha256) == 64


def test_torchscript_and_onnx_and_factory_agree(tmp_path, digits):
    ref = load_model(digits["model"])
    x = np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32)
    want = ref.reference()({"image": x})[0]

    ts = tmp_path / "m.pt"
    torch.jit.save(torch.jit.trace(ref.torch_module, torch.from_numpy(x)), ts)
    m_ts = load_model(ts, ["image:1,1,8,8"])
    assert m_ts.kind == "torchscript"
    np.testing.assert_allclose(m_ts.reference()({"image": x})[0], want, atol=1e-5)

    onnx_path = export_onnx(ref, tmp_path / "m.onnx")
    m_onnx = load_model(onnx_path)
    assert m_onnx.kind == "onnx" and m_onnx.inputs[0].shape == (1, 1, 8, 8)
    np.testing.assert_allclose(m_onnx.reference()({"image": x})[0], want, atol=1e-4)

    m_fac = load_model("test_foundation_ingest:chain_factory", ["1,1,6,6"])
    assert m_fac.kind == "factory" and m_fac.inputs[0].name == "x"


def test_factory_needs_input_shape():
    with pytest.raises(InputSpecError, match="--input-shape"):
        load_model("test_foundation_ingest:chain_factory")


def test_pickle_needs_trust(tmp_path):
    p = tmp_path / "pickled.pt"
    torch.save(chain_factory(), p)
    with pytest.raises(ModelLoadError, match="--trust-pickle"):
        load_model(p, ["1,1,6,6"])
    m = load_model(p, ["1,1,6,6"], trust_pickle=True)
    assert m.kind == "pickle"


def test_state_dict_is_not_a_model(tmp_path):
    p = tmp_path / "weights.pt"
    torch.save(chain_factory().state_dict(), p)
    with pytest.raises(ModelLoadError, match="only weights"):
        load_model(p, ["1,1,6,6"])


@pytest.mark.parametrize("cut", [0, 100, 20000])
def test_truncated_files_are_clear_errors(tmp_path, digits, cut):
    data = Path(digits["model"]).read_bytes()[:cut]
    p = tmp_path / "cut.pt2"
    p.write_bytes(data)
    with pytest.raises(ModelLoadError, match="cut.pt2"):
        load_model(p)


def test_truncated_onnx(tmp_path, digits):
    good = export_onnx(load_model(digits["model"]), tmp_path / "good.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        load_model(bad)


def test_not_a_model(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    with pytest.raises(ModelLoadError, match="unknown model file type"):
        load_model(p)


def test_wrong_input_shape(digits):
    with pytest.raises(InputSpecError, match=r"static shape \[1, 1, 8, 8\]"):
        load_model(digits["model"], ["1,3,8,8"])
    with pytest.raises(InputSpecError, match="does not run on inputs"):
        load_model("test_foundation_ingest:chain_factory", ["1,3,6,6"])


def test_analysis_counts_match_torch_and_hand(tmp_path):
    m = load_model("test_foundation_ingest:chain_factory", ["1,1,6,6"])
    stats = analyze_onnx(export_onnx(m, tmp_path / "c.onnx"))
    assert stats.params == sum(p.numel() for p in m.torch_module.parameters())
    # conv a: 36 outputs x 4 ch x 9 taps; conv b: 36 x 2 ch x 4 in
    assert stats.macs == 36 * 4 * 9 + 36 * 2 * 4
    assert stats.weight_params == 4 * 9 + 2 * 4 and stats.other_params == 4 + 2
    assert stats.weight_bytes["fp32"] == 4 * stats.params
    assert stats.weight_bytes["int8"] == stats.weight_params + 4 * stats.other_params
    # liveness: input (144 B) + conv a out (576 B) live together; then relu out (576) with conv a out;
    # peak = max(144+576, 576+576, 576+288) = 1152 B; summing every tensor would give 144+576+576+288
    assert stats.peak_activation_bytes == 1152
    assert stats.total_activation_bytes == 144 + 576 + 576 + 288


def test_analysis_of_digits_matches_torch(digits, tmp_path):
    m = load_model(digits["model"])
    stats = analyze_onnx(export_onnx(m, tmp_path / "d.onnx"))
    model = DigitsCNN()
    # BatchNorm is folded into the convs by the exporter: count conv+linear params only
    folded = sum(p.numel() for mod in model.modules() if isinstance(mod, (nn.Conv2d, nn.Linear))
                 for p in mod.parameters())
    assert stats.params == folded
    assert stats.macs == 64 * 16 * 9 + 16 * 32 * 16 * 9 + 16 * 32 * 32 * 9 + 32 * 10
    assert 0 < stats.peak_activation_bytes < stats.total_activation_bytes
