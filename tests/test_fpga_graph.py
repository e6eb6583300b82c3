"""FPGA target, graph mode: branching graphs (residual adds, concats, forks), depthwise-separable blocks, BatchNorm,
average pooling, per-channel constants and Clip quantized with brevitas' graph mode (power-of-two scales), built by
hls4ml and checked bit-exact in its C simulation; the MLPerf Tiny shapes (examples/tinyml_fpga, trained on real
digits) within a PYNQ-Z2; refusals that name what hls4ml lacks or the resources with figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit.errors import UnsupportedOpError

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tinyml_fpga"
DIGITS = ROOT / "examples" / "digits"

pytest.importorskip("hls4ml")
pytest.importorskip("brevitas")
pytest.importorskip("qonnx")


def _convert(model, tmp_path, board="xilinx/pynq-z2", eval_data=DIGITS / "eval.npz", calib=DIGITS / "calib.npz",
             **kw):
    from edgekit.pipeline import convert

    return convert(model, target="fpga", board=board, precision="int8", calib=str(calib),
                   eval_data=str(eval_data) if eval_data else None, out=tmp_path / "b", cache=False, **kw)


def _check_fabric(res, kinds: set[str]):
    """What a user checks: every sample bit-exact, the estimate within 80% of the board, the estimate's timing,
    verification against float passed, the graph's layer kinds taken."""
    art = res.manifest["artifact"]
    be = art["bit_exact"]
    assert be["samples"] > 64 and be["exact"] == be["samples"] and be["max_abs_diff"] == 0.0
    est = art["resources_estimate"]
    assert est["fits"] and max(est["utilization"].values()) <= 0.8
    t = art["timing_estimate"]
    assert 0 < t["interval_cycles"] <= t["latency_cycles"] and t["latency_us"] > 0
    assert kinds <= {lay["kind"] for lay in art["layers"]}, art["layers"]
    assert all(q["pow2"] for q in art["quantization"]["quant_nodes"])
    res_json = json.loads((res.out_dir / "resources.json").read_text())
    assert res_json["layers"] and res_json["timing"]["layers"]
    v = res.verification
    assert v.passed, v.failures
    return art, v


# ---------------------------------------------------------------- refusals (before any build)


def _export(tmp_path, model, shape=(1, 1, 8, 8)):
    import torch

    path = tmp_path / "m.pt2"
    torch.export.save(torch.export.export(model.eval(), (torch.zeros(*shape),)), path)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).random((32, *shape[1:]), dtype=np.float32))
    return path


def test_squeeze_excitation_scale_is_refused_as_a_limit_of_hls4ml(tmp_path):
    """MobileNetV3's SE block multiplies a feature map by a per-channel gate ([1, C, H, W] x [1, C, 1, 1]): hls4ml's
    Multiply merge takes two tensors of one shape."""
    import torch

    from edgekit.pipeline import convert

    class SE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.gate, self.fc = torch.nn.Conv2d(1, 4, 3), torch.nn.Conv2d(4, 4, 1), torch.nn.Linear(144, 10)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            y = y * torch.nn.functional.hardsigmoid(self.gate(y.mean((2, 3), keepdim=True)))
            return self.fc(y.flatten(1))

    with pytest.raises(UnsupportedOpError, match=r"Mul .*hls4ml's Mul merge layer takes two tensors of one shape"):
        convert(_export(tmp_path, SE()), target="fpga", precision="int8", calib=str(tmp_path / "calib.npz"),
                out=tmp_path / "b", cache=False)
    assert not (tmp_path / "b").exists()


def _keras_like(tmp_path, one_sided: bool):
    """What Keras models bring (MLPerf Tiny's published .h5 files): an NHWC input transposed to NCHW at the start,
    and TensorFlow's SAME padding at stride 2 (one-sided: ONNX pads [0, 0, 1, 1])."""
    import torch

    F = torch.nn.functional

    class Keras(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, stride=2, padding=0 if one_sided else 1)
            self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):  # x: [N, H, W, C]
            x = x.permute(0, 3, 1, 2)
            y = torch.relu(self.c1(F.pad(x, (0, 1, 0, 1)) if one_sided else x))
            return self.fc(torch.relu(self.c2(y)).mean((2, 3)))

    torch.manual_seed(0)
    path = tmp_path / "keras_like.pt2"
    torch.export.save(torch.export.export(Keras().eval(), (torch.zeros(1, 8, 8, 3),)), path)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).random((96, 8, 8, 3), dtype=np.float32))
    return path


@pytest.mark.slow  # ~30 s: hls4ml C simulation
def test_channels_last_input_is_bit_exact(tmp_path):
    """The NHWC input's transpose is done on the host (the fabric streams channels-last anyway)."""
    res = _convert(_keras_like(tmp_path, False), tmp_path, calib=tmp_path / "calib.npz", eval_data=None)
    be = res.manifest["artifact"]["bit_exact"]
    assert be["exact"] == be["samples"] > 64 and be["max_abs_diff"] == 0.0
    assert res.verification.passed, res.verification.failures


def test_one_sided_conv_padding_is_refused_before_calibration(tmp_path):
    from edgekit.pipeline import convert

    with pytest.raises(UnsupportedOpError, match=r"padded on one side only .*not bit-exact"):
        convert(_keras_like(tmp_path, True), target="fpga", precision="int8", calib=str(tmp_path / "calib.npz"),
                out=tmp_path / "b", cache=False)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # ~40 s: hls4ml C simulation
def test_hardswish_and_hardsigmoid_are_bit_exact(tmp_path):
    """HardSwish (x * clip(x/6 + 1/2, 0, 1): an affine layer, a clip, hls4ml's Multiply) after a conv + BatchNorm,
    and HardSigmoid before the classifier: bit-exact in the C simulation and close to float."""
    import torch

    F = torch.nn.functional

    class Hard(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.bn = torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
            self.c2, self.fc = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Linear(128, 10)

        def forward(self, x):
            y = F.max_pool2d(F.hardswish(self.bn(self.c1(x))), 2)
            return self.fc(F.hardsigmoid(self.c2(y)).flatten(1))

    torch.manual_seed(0)
    path = tmp_path / "hard.pt2"
    torch.export.save(torch.export.export(Hard().eval(), (torch.zeros(1, 1, 8, 8),)), path)
    res = _convert(path, tmp_path, eval_data=None)
    art = res.manifest["artifact"]
    be = art["bit_exact"]
    assert be["exact"] == be["samples"] > 64 and be["max_abs_diff"] == 0.0
    kinds = [lay["kind"] for lay in art["layers"]]
    assert kinds.count("hard sigmoid (clip 0..1)") == 2 and "mul (two tensors)" in kinds
    assert res.verification.passed, res.verification.failures


def test_tanh_inside_the_network_is_refused_for_its_table(tmp_path):
    import torch

    from edgekit.pipeline import convert

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    with pytest.raises(UnsupportedOpError, match=r"Tanh .*lookup table"):
        convert(_export(tmp_path, model), target="fpga", precision="int8", calib=str(tmp_path / "calib.npz"),
                out=tmp_path / "b", cache=False)


def test_depthwise_reuse_divides_its_window_and_timing_follows_reuse():
    from edgekit import fabric as fr

    dw = fr.FabricLayer("dw", 64 * 9, 8, 8, 64, kernel=9, pixels=64)
    dense = fr.FabricLayer("fc", 640, 8, 8, 10)
    assert [dw.reuse(r) for r in (1, 2, 4, 8, 16, 1024)] == [1, 1, 3, 3, 9, 9]
    assert dense.reuse(64) == 64
    fast, slow = (fr.timing([dw, dense], r, 100.0, io_stream=True) for r in (1, 16))
    assert fast["interval_cycles"] < slow["interval_cycles"] and fast["latency_us"] < slow["latency_us"]
    assert slow["latency_us"] == pytest.approx(slow["latency_cycles"] / 100.0, abs=1e-3)


def test_per_channel_constants_and_spatial_mean_are_standardized():
    """A Mul by a per-channel constant after a ReLU (nothing to fold it into in the ONNX graph) becomes an affine
    layer; a ReduceMean over H, W becomes a global pool; a Mul by a [1, 1, H, W] map is refused with its shape."""
    import onnx
    from edgekit.converters.fpga import graph as fg
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def model(const_shape):
        inits = [numpy_helper.from_array(rng.normal(size=(4, 1, 3, 3)).astype(np.float32), "w"),
                 numpy_helper.from_array(rng.random(const_shape, dtype=np.float32) + 0.5, "g"),
                 numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
                 numpy_helper.from_array(rng.normal(size=(10, 4)).astype(np.float32), "fw")]
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"], name="relu"),
                 helper.make_node("Mul", ["r", "g"], ["m"], name="gain"),
                 helper.make_node("ReduceMean", ["m", "axes"], ["p"], name="mean", keepdims=0),
                 helper.make_node("Gemm", ["p", "fw"], ["y"], name="fc", transB=1)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])

    x = rng.random((4, 1, 8, 8), dtype=np.float32)
    proto = model((1, 4, 1, 1))
    ref = onnx.ModelProto()
    ref.CopyFrom(proto)
    gm, layers = fg.standardize(fg.to_torch(proto, "m"), proto, x)
    kinds = [lay["kind"] for lay in layers]
    assert "Mul by a constant (folded)" in kinds and "average pool (depthwise conv, weights 1/k)" in kinds
    import onnxruntime as ort
    import torch

    want = ort.InferenceSession(ref.SerializeToString()).run(None, {"x": x[:1]})[0]
    with torch.no_grad():
        got = gm(torch.from_numpy(x[:1])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    proto = model((1, 1, 8, 8))
    with pytest.raises(UnsupportedOpError, match=r"Mul by a constant of shape \[1, 1, 8, 8\]"):
        fg.standardize(fg.to_torch(proto, "m"), proto, x)


# ---------------------------------------------------------------- branching graphs, bit-exact


@pytest.mark.slow  # a C-sim compile: in the full run (pytest -m 'not zoo')
def test_residual_digits_cnn_is_bit_exact(digits, tmp_path):
    """The digits example's residual CNN (residual Add, a spatial mean as the pool), once refused as 'not a chain'."""
    res = _convert(digits["model"], tmp_path)
    art, v = _check_fabric(res, {"add (two tensors)", "average pool (depthwise conv, weights 1/k)"})
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 2.0
    assert art["io_type"] == "io_stream"


@pytest.mark.slow
def test_concat_fork_clip_and_per_channel_constants_on_zcu104(tmp_path):
    """The input forks into two convs whose outputs are concatenated (one through Clip(0, 6)), BatchNorm after the
    concat (no conv before it), a per-channel gain after a ReLU, a 2x2 average pool: bit-exact on the Vitis backend."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Cat(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(1, 4, 1)
            self.bn, self.c, self.fc = nn.BatchNorm2d(8), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(128, 10)
            self.register_buffer("gain", torch.linspace(0.5, 2.0, 8).view(1, 8, 1, 1))

        def forward(self, image):
            y = torch.cat([torch.clamp(self.a(image), 0, 6), torch.relu(self.b(image))], 1)
            y = torch.relu(self.bn(y)) * self.gain  # after the ReLU: a depthwise 1x1 conv on the fabric
            return self.fc(nn.functional.avg_pool2d(torch.relu(self.c(y)), 2).flatten(1))

    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy((d.images / 16.0).astype(np.float32)[:, None])
    y = torch.from_numpy(d.target)
    m = Cat()
    opt = torch.optim.Adam(m.parameters(), 3e-3)
    for _ in range(4):
        for i in range(0, 1300, 64):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x[i:i + 64]), y[i:i + 64]).backward()
            opt.step()
    path = tmp_path / "cat.pt2"
    torch.export.save(torch.export.export(m.eval(), (torch.zeros(1, 1, 8, 8),)), path)
    np.savez(tmp_path / "calib.npz", image=x[1300:1500].numpy())
    np.savez(tmp_path / "eval.npz", image=x[1500:].numpy(), label=y[1500:].numpy())
    res = _convert(path, tmp_path, board="xilinx/zcu104", eval_data=tmp_path / "eval.npz",
                   calib=tmp_path / "calib.npz")
    art, _ = _check_fabric(res, {"concat", "relu6", "batchnorm2d"})
    assert art["backend"] == "Vitis"


# ---------------------------------------------------------------- the MLPerf Tiny shapes (examples/tinyml_fpga)


@pytest.mark.slow
@pytest.mark.parametrize("name,kinds", [
    ("resnet8", {"add (two tensors)", "conv"}),
    ("dscnn", {"depthwise conv", "average pool (depthwise conv, weights 1/k)"}),
])
def test_mlperf_tiny_classifiers_fit_a_pynq_z2_bit_exact(tmp_path, name, kinds):
    res = _convert(TINY / f"{name}.pt2", tmp_path)
    art, v = _check_fabric(res, kinds)
    assert v.float_accuracy > 0.9 and 100 * (v.float_accuracy - v.converted_accuracy) <= 2.0
    if name == "dscnn":  # hls4ml's Resource depthwise conv is wrong in io_stream: edgekit gives them Latency
        dws = [lay for lay in json.loads((res.out_dir / "resources.json").read_text())["layers"] if lay["depthwise"]]
        assert dws and all(9 % lay["reuse_factor"] == 0 or 64 % lay["reuse_factor"] == 0 for lay in dws)


@pytest.mark.slow  # ~100 s: 240 held-out windows through the C simulation
def test_keyword_spotting_dscnn_on_speech_mfccs_fits_a_pynq_z2_bit_exact(tmp_path):
    """MLPerf Tiny's KWS network on its own input: 49x10 MFCCs of ten command words spoken by espeak-ng
    (examples/tinyml_fpga/kws.py), judged on two voices the model never heard."""
    res = _convert(TINY / "kws_dscnn.pt2", tmp_path, calib=TINY / "kws_calib.npz", eval_data=TINY / "kws_eval.npz")
    art, v = _check_fabric(res, {"depthwise conv", "conv", "average pool (depthwise conv, weights 1/k)"})
    assert v.float_accuracy > 0.7 and 100 * (v.float_accuracy - v.converted_accuracy) <= 2.0
    assert art["reuse_factor"] > 1  # 64-channel blocks over 25x5 frames: the weights are shared in time


@pytest.mark.slow
def test_mlperf_tiny_autoencoder_fits_a_pynq_z2_bit_exact(tmp_path):
    res = _convert(TINY / "autoencoder.pt2", tmp_path, eval_data=TINY / "ae_eval.npz",
                   output_kinds={"output": "regression"})
    art, v = _check_fabric(res, {"linear"})
    assert art["io_type"] == "io_parallel"
    assert v.outputs[0].metrics["snr_db"] >= 15.0  # the reconstruction: 64 pixels, not classes


@pytest.mark.slow  # ~30 s: the graph is quantized before the estimate refuses it
def test_visual_wake_words_mobilenet_is_refused_with_figures(tmp_path):
    """MobileNetV1-0.25 at 96x96x3 (MLPerf Tiny's VWW network; BatchNorm statistics set on the calibration images,
    weights untrained: only its size is at stake) does not fit a PYNQ-Z2 at any reuse factor."""
    import torch

    from edgekit.pipeline import convert

    sys.path.insert(0, str(TINY))
    from nets import MobileNetV1

    torch.manual_seed(0)
    m = MobileNetV1()
    x = torch.from_numpy(np.random.default_rng(0).random((16, 3, 96, 96), dtype=np.float32))
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None
    m.train()
    with torch.no_grad():
        m(x)
    path = _export(tmp_path, m, shape=(1, 3, 96, 96))
    with pytest.raises(UnsupportedOpError,
                       match=r"does not fit xilinx/pynq-z2: .* \d+ DSP, \d+ BRAM36, \d+ LUT, \d+ FF against 220 DSP, "
                             r"140 BRAM36, 53200 LUT"):
        convert(path, target="fpga", board="xilinx/pynq-z2", precision="int8", calib=str(tmp_path / "calib.npz"),
                out=tmp_path / "b", cache=False)
    assert not (tmp_path / "b").exists()
