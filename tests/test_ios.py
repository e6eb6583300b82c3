"""iOS / Core ML target on the digits example: real coremltools conversions, checked on Linux.

Core ML predict needs macOS: here the package's decompressed MIL program runs in torch
(converters/coreml/interpreter.py); tests that need Core ML itself skip off macOS.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coremltools", reason="the ios extra is not installed: pip install 'edgekit[ios]'")

from edgekit.errors import ConversionError, ProfileError, UnsupportedOpError  # noqa: E402
from edgekit.pipeline import convert  # noqa: E402

ON_MAC = sys.platform == "darwin"
# storage per compressed weight element relative to fp32 (bits / 32), with the room the
# per-tensor LUT / per-channel scales and 64-byte blob alignment take on tiny tensors
RATIO = {"int8-weight": (0.25, 0.30), "int6-weight": (0.1875, 0.23), "int4-weight": (0.125, 0.16),
         "prune-50": (0.28, 0.32)}
STORAGE_OP = {"int8-weight": "constexpr_affine_dequantize", "int6-weight": "constexpr_lut_to_dense",
              "int4-weight": "constexpr_lut_to_dense", "prune-50": "constexpr_sparse_to_dense"}


@pytest.fixture(scope="module")
def builds(digits, tmp_path_factory):
    """One pipeline run per precision (fp16 default board iphone-15-pro), shared by the tests below."""
    out = {}
    root = tmp_path_factory.mktemp("ios")
    for p in ("fp16", "int8-weight", "int4-weight", "int6-weight", "prune-50"):
        out[p] = convert(digits["model"], target="ios", out=root / p, precision=p, eval_data=str(digits["eval"]))
    return out


def _pkg(res) -> Path:
    return res.out_dir / "model.mlpackage"


@pytest.mark.parametrize("precision", ["fp16", "int8-weight", "int4-weight", "int6-weight", "prune-50"])
def test_digits_converts_and_verifies(builds, precision):
    res = builds[precision]
    man = res.manifest
    assert res.verification.passed, res.verification.failures
    assert man["format"] == "mlpackage" and man["artifact"]["primary"] == "model.mlpackage"
    assert man["artifact"]["minimum_deployment_target"] == "iOS17"  # iphone-15-pro: min_ios 17
    assert man["artifact"]["compute_precision"] == "fp16"
    # every file of the package is in the manifest with its hash
    pkg_files = sorted(p.relative_to(res.out_dir).as_posix() for p in _pkg(res).rglob("*") if p.is_file())
    assert pkg_files and all(f in man["files"] for f in pkg_files)
    assert any(f.endswith("weight.bin") for f in pkg_files)
    # accuracy measured on the 450 eval samples, float vs package
    v = man["verification"]
    assert v["eval_samples"] == 450 and v["float_accuracy"] > 0.97
    assert 100 * (v["float_accuracy"] - v["converted_accuracy"]) <= man["tolerance"]["max_accuracy_drop_points"]
    assert "not Core ML's fp16 arithmetic" in v["runtime"] or ON_MAC
    assert any("Unverified on Linux" in n for n in man["notes"]) or ON_MAC


def test_spec_io_matches_source(builds):
    import coremltools as ct

    spec = ct.utils.load_spec(str(_pkg(builds["fp16"])))
    assert spec.WhichOneof("Type") == "mlProgram"
    assert spec.specificationVersion == 8  # iOS 17
    (inp,), (out,) = spec.description.input, spec.description.output
    arr_type = ct.proto.FeatureTypes_pb2.ArrayFeatureType
    assert inp.name == "image" and list(inp.type.multiArrayType.shape) == [1, 1, 8, 8]
    assert out.name == "output" and list(out.type.multiArrayType.shape) == [1, 10]
    # fp16 compute, but the I/O stays float32 (set explicitly: iOS 16+ would make it fp16)
    assert inp.type.multiArrayType.dataType == arr_type.FLOAT32
    assert out.type.multiArrayType.dataType == arr_type.FLOAT32
    io = builds["fp16"].manifest["artifact"]["linux_checks"]["io"]
    assert io["matches_source"] and io["inputs"][0]["dtype"] == "float32"


def test_op_list_recorded(builds):
    ops = builds["fp16"].manifest["artifact"]["linux_checks"]["op_counts"]
    assert ops["conv"] == 3 and ops["linear"] == 1 and ops["relu"] == 3  # BatchNorm folded into the convs
    assert "batch_norm" not in ops
    assert builds["fp16"].manifest["artifact"]["linux_checks"]["ane_flags"] == []


def test_fp16_package_halves_weight_bytes(builds):
    w = builds["fp16"].manifest["artifact"]["linux_checks"]["weights"]
    assert w["fp32_weight_bytes"] == 4 * 14288  # conv + linear weights of the digits CNN (BN folded)
    assert 0.5 <= w["file_ratio_vs_fp32_weights"] <= 0.55  # fp16 + biases + blob headers
    assert w["compressed_tensors"] == 0


@pytest.mark.parametrize("precision", ["int8-weight", "int6-weight", "int4-weight", "prune-50"])
def test_weight_bytes_match_requested_compression(builds, precision):
    w = builds[precision].manifest["artifact"]["linux_checks"]["weights"]
    lo, hi = RATIO[precision]
    assert lo <= w["compressed_ratio_vs_fp32"] <= hi, w
    # the two convs with >= 2048 weights are compressed; the 144-weight stem and the head stay fp16
    assert w["compressed_tensors"] == 2 and w["compressed_elements"] == 32 * 16 * 9 + 32 * 32 * 9
    assert w["storage"] == {STORAGE_OP[precision]: 2}
    assert w["measured_bytes"] < builds["fp16"].manifest["artifact"]["linux_checks"]["weights"]["measured_bytes"]


def test_palettized_weights_have_at_most_2_pow_bits_values(builds):
    from edgekit.converters.coreml.mil import load_program

    for precision, bits in (("int4-weight", 4), ("int6-weight", 6)):
        prog = load_program(_pkg(builds[precision]), decompress=True)
        convs = [op for op in prog.functions["main"].operations if op.op_type == "conv"]
        sizes = [op.inputs["weight"].val.size for op in convs]
        # count in float32: numpy 2.4's np.unique miscounts float16 arrays (42 "unique" of 16 values)
        uniques = [len(np.unique(op.inputs["weight"].val.astype(np.float32))) for op in convs]
        for size, n in zip(sizes, uniques, strict=True):
            if size >= 2048:
                assert n <= 2 ** bits, (precision, size, n)
            else:
                assert n > 2 ** bits  # below weight_threshold: left at fp16


def test_pruned_weights_are_half_zero(builds):
    from edgekit.converters.coreml.mil import load_program

    prog = load_program(_pkg(builds["prune-50"]), decompress=True)
    for op in prog.functions["main"].operations:
        if op.op_type == "conv" and op.inputs["weight"].val.size >= 2048:
            assert np.mean(op.inputs["weight"].val == 0) == pytest.approx(0.5, abs=0.01)


def test_numeric_error_grows_with_compression(builds):
    """The host check reads the compressed weights back: coarser storage, larger error."""
    err = {p: builds[p].verification.outputs[0].max_rel_error for p in builds}
    assert err["fp16"] < 5e-3
    assert err["fp16"] < err["int8-weight"] < err["int6-weight"] < err["int4-weight"] < err["prune-50"]


def test_interpreter_reads_weights_from_the_package(builds, tmp_path):
    """Damage the weight file: the host runner's outputs change (it does not fall back to torch)."""
    from edgekit.converters.coreml.interpreter import MILInterpreter
    from edgekit.converters.coreml.mil import load_program

    pkg = tmp_path / "model.mlpackage"
    shutil.copytree(_pkg(builds["fp16"]), pkg)
    x = {"image": np.load(builds["fp16"].out_dir / "golden.npz")["input_0"][:1]}
    before = MILInterpreter(load_program(pkg, decompress=True))(x)[0]
    wbin = pkg / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    raw = bytearray(wbin.read_bytes())
    # blob headers: sentinel 0xDEADBEEF, dtype (u32), data size (u64), data offset (u64); flip the sign of
    # every fp16 value of the largest blob (the 32x32x3x3 conv) and leave the headers intact
    blobs = []
    for at in range(0, len(raw) - 24, 64):
        if raw[at:at + 4] == bytes.fromhex("efbeadde"):
            size, offset = struct.unpack_from("<QQ", raw, at + 8)
            blobs.append((size, offset))
    size, offset = max(blobs)
    for i in range(offset + 1, offset + size, 2):
        raw[i] ^= 0x80
    wbin.write_bytes(bytes(raw))
    after = MILInterpreter(load_program(pkg, decompress=True))(x)[0]
    assert np.max(np.abs(before - after)) > 1e-2


def test_fp32_is_flagged_off_the_neural_engine(digits, tmp_path):
    res = convert(digits["model"], target="ios", out=tmp_path / "o", precision="fp32")
    checks = res.manifest["artifact"]["linux_checks"]
    assert any("Neural Engine computes in fp16 only" in f for f in checks["ane_flags"])
    assert any("Neural Engine" in w for w in res.warnings)
    assert res.verification.outputs[0].max_rel_error < 1e-5  # fp32 program vs torch: same arithmetic
    assert 1.0 <= checks["weights"]["file_ratio_vs_fp32_weights"] <= 1.05
    # one fp32 weight size for the model, printed and recorded alike: the analysis' (weights and biases)
    fp32 = res.manifest["analysis"]["weight_bytes"]["fp32"]
    assert checks["weights"]["fp32_bytes"] == checks["weights"]["expected_bytes"] == fp32
    sizes = {int(n.replace(",", "")) for t in res.notes for n in re.findall(r"([\d,]+) B of weights and biases at fp32", t)}
    assert sizes == {fp32}


def test_board_sets_deployment_target(digits, tmp_path):
    res = convert(digits["model"], target="ios", out=tmp_path / "o", board="apple/iphone-13", precision="int8-weight")
    assert res.manifest["artifact"]["minimum_deployment_target"] == "iOS16"
    import coremltools as ct

    assert ct.utils.load_spec(str(_pkg(res))).specificationVersion == 7  # iOS 16


def test_precision_needing_newer_ios_is_refused(digits, tmp_path):
    with pytest.raises(ProfileError, match=r"needs Core ML for iOS 16\+.*--set min_ios=16"):
        convert(digits["model"], target="ios", out=tmp_path / "o", board="apple/iphone-13",
                board_set=["min_ios=15"], precision="int4-weight")
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(ON_MAC, reason="on macOS W8A8 calibration runs Core ML predict (linear_quantize_activations)")
def test_w8a8_on_linux_is_calibrated_in_torch_and_verified(digits, tmp_path):
    """int8 (W8A8) was refused off macOS (coremltools calibrates activations with Core ML predict). It is now
    calibrated in torch (PT2E, the observer chosen by measuring) and converted into the iOS 17 W8A8 form: quantize /
    dequantize ops around the layers and int8 weight constants; the host MIL interpreter runs those ops, and the
    build keeps the float model's accuracy on held-out digits."""
    import coremltools as ct

    from edgekit.converters.coreml.interpreter import MILInterpreter
    from edgekit.converters.coreml.mil import load_program, op_counts

    res = convert(digits["model"], target="ios", out=tmp_path / "o", precision="int8", calib=str(digits["calib"]),
                  eval_data=str(digits["eval"]))
    art = res.manifest["artifact"]
    ops = op_counts(load_program(_pkg(res), decompress=False))
    assert ops.get("quantize", 0) >= 3 and ops.get("dequantize", 0) >= 3, ops
    assert ops.get("constexpr_affine_dequantize") == art["linux_checks"]["weights"]["weight_tensors"] == 4, ops
    assert ct.utils.load_spec(str(_pkg(res))).specificationVersion >= 8  # iOS 17: activation quantize ops
    q = art["quantization"]
    assert set(q["calibration_measured_snr_db"]) == {"histogram", "minmax"}
    assert q["calibration_method"] == max(q["calibration_measured_snr_db"], key=q["calibration_measured_snr_db"].get)
    v = res.verification
    assert v.passed and v.float_accuracy - v.converted_accuracy <= 0.01, (v.float_accuracy, v.converted_accuracy)
    # the interpreter really quantizes: with quantize / dequantize passing values through, the outputs move
    from edgekit.converters.coreml import interpreter as coreml_mil

    x = {"image": np.load(digits["eval"])["image"][:8].astype(np.float32)}
    interp = MILInterpreter(load_program(_pkg(res), decompress=True))
    got = [interp({"image": x["image"][i:i + 1]})[0] for i in range(8)]
    real = dict(coreml_mil._KERNELS)
    coreml_mil._KERNELS.update(quantize=lambda torch, a: a["input"], dequantize=lambda torch, a: a["input"].float())
    try:
        interp = MILInterpreter(load_program(_pkg(res), decompress=True))
        through = [interp({"image": x["image"][i:i + 1]})[0] for i in range(8)]
    finally:
        coreml_mil._KERNELS.update(real)
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, through)) > 1e-3


@pytest.mark.skipif(not ON_MAC, reason="Core ML predict exists only on macOS; on Linux the MIL program runs in torch")
def test_core_ml_predict_on_macos(digits, tmp_path):
    res = convert(digits["model"], target="ios", out=tmp_path / "o", precision="fp16", eval_data=str(digits["eval"]))
    assert res.verification.runtime.startswith("Core ML predict")
    assert res.verification.passed


def _job(model, tmp_path, precision="fp16"):
    from edgekit.converters import ConvertJob
    from edgekit.profiles import load_board, load_target

    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    return ConvertJob(model=model, target=load_target("ios"), board=load_board("apple/iphone-15-pro"),
                      precision=precision, calib=None, out_dir=tmp_path / "out", work_dir=tmp_path / "work",
                      log=lambda m: None, warn=lambda m: None)


class _Unconvertible:
    """A module whose forward uses an op coremltools has no converter for (special.i0e)."""

    @staticmethod
    def module():
        import torch

        class M(torch.nn.Module):
            def forward(self, x):
                y = torch.relu(x)
                return torch.special.i0e(y)

        return M()


def test_unconvertible_op_names_op_node_and_source_line(tmp_path):
    import torch

    from edgekit.converters.coreml.converter import CONVERTER
    from edgekit.ingest import Model, TensorSpec

    mod = _Unconvertible.module().eval()
    ep = torch.export.export(mod, (torch.zeros(1, 4),))
    model = Model("unconvertible.pt2", "exported_program", "0" * 64, [TensorSpec("x", (1, 4))],
                  [TensorSpec("output", (1, 4))], torch_module=ep.module(), exported=ep)
    with pytest.raises(UnsupportedOpError) as info:
        CONVERTER.convert(_job(model, tmp_path))
    msg = str(info.value)
    assert "special_i0e" in msg  # the op
    assert "node 'special_i0e'" in msg  # the node in the exported graph
    assert f"{Path(__file__).name}:" in msg and "torch.special.i0e(y)" in msg  # the torch source line


def test_gather_is_flagged_for_the_neural_engine(tmp_path):
    import torch

    from edgekit.converters.coreml.converter import CONVERTER
    from edgekit.ingest import Model, TensorSpec

    class Pick(torch.nn.Module):
        def forward(self, x, idx):
            return torch.gather(x, 1, idx) * 2

    ep = torch.export.export(Pick().eval(), (torch.zeros(1, 8), torch.zeros(1, 3, dtype=torch.int64)))
    model = Model("pick.pt2", "exported_program", "0" * 64, [TensorSpec("x", (1, 8)), TensorSpec("idx", (1, 3), "int64")],
                  [TensorSpec("output", (1, 3))], torch_module=ep.module(), exported=ep)
    art = CONVERTER.convert(_job(model, tmp_path))
    assert art.meta["linux_checks"]["io"]["inputs"][1]["dtype"] == "int32"  # Core ML has no int64 tensors
    assert any("gather" in f for f in art.meta["linux_checks"]["ane_flags"])


def test_onnx_input_is_refused(tmp_path, digits):
    from edgekit.converters.coreml.converter import CONVERTER
    from edgekit.ingest import Model, TensorSpec

    model = Model("m.onnx", "onnx", "0" * 64, [TensorSpec("image", (1, 1, 8, 8))], [TensorSpec("output", (1, 10))],
                  onnx_path=tmp_path / "m.onnx")
    with pytest.raises(ConversionError, match="Core ML converts torch models"):
        CONVERTER.convert(_job(model, tmp_path))


def test_manifest_round_trips_as_json(builds):
    man = json.loads((builds["int4-weight"].out_dir / "manifest.json").read_text())
    assert man["artifact"]["compression"]["method"] == "palettize"
    assert man["toolchain"]["coremltools"].startswith(("8.", "9."))
    assert man["runner"]["files"] == sorted(man["runner"]["files"])
    assert {"run.py", "EdgekitModelTests.swift", "README.md"} <= set(man["runner"]["files"])


def test_pixel_shuffle_runs_in_the_host_interpreter(tmp_path):
    """A pixel shuffle (sub-pixel up-sampling; also what edgekit's W8A8 quantizer writes for an r x r transposed
    conv, as in PP-OCR's text detector) had no kernel in the host MIL interpreter: the build could not be verified on
    Linux. It now runs, and matches the float model."""
    import torch

    class Up(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)

        def forward(self, x):
            return torch.nn.functional.pixel_shuffle(self.conv(x), 2)

    ep = torch.export.export(Up().eval(), (torch.zeros(1, 1, 8, 8),))
    torch.export.save(ep, tmp_path / "up.pt2")
    res = convert(str(tmp_path / "up.pt2"), target="ios", out=tmp_path / "o", precision="fp32")
    assert res.verification.passed, res.verification.failures
    assert res.manifest["artifact"]["linux_checks"]["op_counts"].get("pixel_shuffle") == 1


def test_prelu_after_a_linear_layer_and_in_3d_converts(tmp_path):
    """coremltools refused a per-channel PReLU at ranks other than 4 ("rank 3 or rank 5 input is only supported
    when all the values of alpha are same": MTCNN's O-Net has one after a Linear layer). edgekit's prelu converter
    writes it out as relu(x) + alpha * min(x, 0) there; the rank-4 PReLU stays MIL's prelu. All three verify
    against float."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv, self.p4 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.PReLU(4, init=0.1)
            self.c1, self.p3 = torch.nn.Conv1d(8, 6, 3, padding=1), torch.nn.PReLU(6, init=0.2)
            self.fc, self.p2 = torch.nn.Linear(4 * 64 + 6 * 8, 16), torch.nn.PReLU(16, init=0.3)
            with torch.no_grad():
                for p in (self.p4, self.p3, self.p2):
                    p.weight.copy_(torch.linspace(0.05, 0.6, p.weight.numel()))  # one alpha per channel

        def forward(self, x):
            a = self.p4(self.conv(x)).flatten(1)
            b = self.p3(self.c1(x[:, 0])).flatten(1)
            return self.p2(self.fc(torch.cat([a, b], 1)))

    torch.export.save(torch.export.export(Net().eval(), (torch.zeros(1, 1, 8, 8),)), tmp_path / "p.pt2")
    res = convert(str(tmp_path / "p.pt2"), target="ios", out=tmp_path / "o", precision="fp16")
    assert res.verification.passed, res.verification.failures
    ops = res.manifest["artifact"]["linux_checks"]["op_counts"]
    assert ops.get("prelu") == 1 and ops.get("minimum", 0) >= 2, ops


@pytest.mark.skipif(ON_MAC, reason="on macOS W8A8 is calibrated by Core ML on the converted program")
def test_an_lstm_converts_through_torch_export_at_fp16_and_w8a8(tmp_path):
    """coremltools' torch.export frontend looked aten.lstm.input up under a name it never registered: LSTM models
    took the TorchScript fallback at fp16 and were refused at W8A8 (that frontend cannot read PT2E's int8
    weights). Its own lstm converter is registered under that name now: both precisions convert from the
    torch.export program into an MIL ``lstm`` op, W8A8 with int8 quantize / dequantize before the Linear, and
    both verify against float on the host."""
    import torch

    from sklearn.datasets import load_digits

    class Rows(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lstm, self.fc = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True), torch.nn.Linear(16, 10)

        def forward(self, x):
            _, (h, _) = self.lstm(x)  # the final state: a getitem on the LSTM's result tuple
            return self.fc(h[-1])

    torch.export.save(torch.export.export(Rows().eval(), (torch.zeros(1, 8, 8),)), tmp_path / "rows.pt2")
    np.savez(tmp_path / "c.npz", x=(load_digits().images[:96] / 16).astype(np.float32))
    for precision in ("fp16", "int8"):
        res = convert(str(tmp_path / "rows.pt2"), target="ios", out=tmp_path / precision, precision=precision,
                      calib=str(tmp_path / "c.npz"))
        art = res.manifest["artifact"]
        assert res.verification.passed, (precision, res.verification.failures)
        assert art["source_route"].startswith("torch.export"), art["source_route"]
        ops = art["linux_checks"]["op_counts"]
        assert ops.get("lstm") == 2, ops
        if precision == "int8":
            assert ops.get("quantize", 0) >= 1 and ops.get("dequantize", 0) >= 1, ops


@pytest.mark.skipif(ON_MAC, reason="on macOS W8A8 is calibrated by Core ML on the converted program")
def test_w8a8_on_linux_takes_an_onnx_comparison(tmp_path):
    """openWakeWord's verifier cascade (an ONNX GreaterOrEqual and Where, as the ONNX bridge writes its If) was
    refused at W8A8: onnx2torch writes aten.greater_equal, which coremltools' torch.export frontend has no converter
    for (the float route reaches it through TorchScript). It is written as aten.ge, converts, and verifies."""
    import torch

    class Cascade(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.first, self.second = torch.nn.Linear(16, 1), torch.nn.Linear(16, 1)

        def forward(self, x):
            p1 = torch.sigmoid(self.first(x))
            return torch.where(p1 >= 0.5, torch.sigmoid(self.second(x)), p1)

    path = tmp_path / "cascade.onnx"
    torch.onnx.export(Cascade().eval(), (torch.zeros(1, 16),), str(path), input_names=["x"], output_names=["score"],
                      opset_version=13, dynamo=False)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32))
    res = convert(str(path), target="ios", out=tmp_path / "o", precision="int8", calib=str(tmp_path / "calib.npz"),
                  output_kinds={"score": "regression"})
    ops = res.manifest["artifact"]["linux_checks"]["op_counts"]
    assert ops.get("greater_equal") == 1 and ops.get("quantize") == 1 and ops.get("select") == 1, ops  # x read by both
    assert res.verification.passed, res.verification.failures


@pytest.mark.skipif(ON_MAC, reason="on macOS W8A8 is calibrated by Core ML, which keeps no chosen layer fp16")
@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_w8a8_failure_keeps_the_fewest_layers_fp16_and_passes(digits, tmp_path):
    """plan_nets.digits_int8_fragile (trained digits weights whose head per-channel INT8 cannot hold: all-INT8
    accuracy collapses to ~10%) on ios W8A8: the mixed-precision search finds the head, the rebuilt package keeps
    it fp16 (no quantize / dequantize before it, its weights fp16 in the weight file) and its real
    re-verification passes within half a point of float; --strict fails the same build instead."""
    sys.path.insert(0, str(Path(__file__).parent / "support"))
    kw = dict(target="ios", precision="int8", input_shape=["1,1,8,8"], calib=str(digits["calib"]),
              eval_data=str(digits["eval"]))
    with pytest.raises(Exception, match="host verification failed"):
        convert("plan_nets:digits_int8_fragile", out=tmp_path / "strict", strict=True, **kw)
    res = convert("plan_nets:digits_int8_fragile", out=tmp_path / "mixed", **kw)
    v, art = res.verification, res.manifest["artifact"]
    assert v.passed and v.float_accuracy - v.converted_accuracy <= 0.005
    mp = art["mixed_precision"]
    assert [k["name"] for k in mp["kept"]] == ["linear"] and mp["passed_after"]
    assert mp["kept"][0]["gain_db"] > 20 and mp["snr_db_before"] < 3  # measured, not assumed
    assert art["quantization"]["nodes_kept_float"] == ["linear"]
    w = art["linux_checks"]["weights"]
    assert w["compressed_tensors"] == art["quantization"]["layers_quantized"] == w["weight_tensors"] - 1
