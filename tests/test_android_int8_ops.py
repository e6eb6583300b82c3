"""Android full-integer INT8 beyond litert-torch's own annotators: a digits CNN trained here (scikit-learn
digits) with PReLU, HardSwish, a BatchNorm after a ReLU, LeakyReLU, Pad, a nearest Resize and a Sub by a
constant. Every one of those has an int8 kernel in TFLite; edgekit annotates or rewrites them
(converters/tflite/int8_rewrites.py). The build must be fully int8 (every op's tensors audited) and keep the float
model's accuracy on the held-out digits."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from edgekit.pipeline import convert  # noqa: E402

pytestmark = pytest.mark.slow  # long toolchain builds: in the full run (pytest -m 'not zoo')


class OpsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.prelu = nn.PReLU(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2)
        self.hswish = nn.Hardswish()
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.bn = nn.BatchNorm2d(32)  # after a ReLU: no conv to fold it into
        self.leaky = nn.LeakyReLU(0.1)
        self.head = nn.Linear(32, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.prelu(self.conv1(image - 0.5))
        x = self.hswish(self.conv2(nn.functional.pad(x, (1, 1, 1, 1))))  # 10x10 -> 4x4
        x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")  # RESIZE_NEAREST_NEIGHBOR
        x = self.leaky(self.bn(torch.relu(self.conv3(x))))
        return self.head(x.mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def ops_digits(tmp_path_factory):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target.astype(np.int64), test_size=0.25, random_state=0,
                                              stratify=d.target)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a net this small trains faster on one thread than on a shared machine's cores
    model = OpsNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    for _ in range(20):
        model.train()
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 32):
            idx = perm[i:i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    torch.set_num_threads(threads)
    assert float((model.prelu.weight.detach() - 0.25).abs().max()) > 0.05  # PReLU trained away from its initial slope
    d = tmp_path_factory.mktemp("ops_digits")
    torch.export.save(torch.export.export(model, (torch.zeros(1, 1, 8, 8),)), d / "ops.pt2")
    np.savez(d / "calib.npz", image=x_tr[:300])
    np.savez(d / "eval.npz", image=x_te, label=y_te)
    return d


@pytest.fixture(scope="module")
def ops_int8(ops_digits):
    return convert(str(ops_digits / "ops.pt2"), "android", ops_digits / "int8", precision="int8",
                   calib=str(ops_digits / "calib.npz"), eval_data=str(ops_digits / "eval.npz"))


def test_prelu_hardswish_bn_after_relu_fully_int8(ops_int8):
    from edgekit.converters.tflite.audit import audit

    art = ops_int8.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == []
    ops = art["op_counts"]
    # TFLite's own int8 kernels for the activations; BN and PReLU's slopes are depthwise conv weights
    assert "HARD_SWISH" not in ops  # written out into ADD / MUL: XNNPACK has no int8 HARD_SWISH
    for op in ("LEAKY_RELU", "PAD", "RESIZE_NEAREST_NEIGHBOR", "DEPTHWISE_CONV_2D", "ADD", "MUL"):
        assert ops.get(op, 0) >= 1, ops
    assert "QUANTIZE" not in ops and "DEQUANTIZE" not in ops
    rep = audit(ops_int8.out_dir / "model.tflite")
    for o in rep["ops"]:  # every op's activation tensors are integer
        assert set(o["types"]) <= {"INT8", "INT32"}, o
    assert art["quantization"]["int8_ops_rewritten"] >= 2  # the BN after the ReLU and the PReLU


def test_int8_accuracy_close_to_float(ops_int8):
    v = ops_int8.verification
    assert v.float_accuracy > 0.9, v.float_accuracy
    drop = 100 * (v.float_accuracy - v.converted_accuracy)
    assert drop <= 3.0, (v.float_accuracy, v.converted_accuracy)
    assert v.passed, v.failures


def test_refusal_says_whose_limitation_it_is():
    """An op TFLite runs in int8 that edgekit cannot quantize is refused as edgekit's limitation, in one line."""
    from types import SimpleNamespace

    from edgekit.profiles import load_target
    from edgekit.stages import op_refusal

    stats = SimpleNamespace(unsupported=[{"op": "ConvTranspose", "node": "node_conv_transpose2d"},
                                         {"op": "Log", "node": "node_log"}])
    msg = op_refusal(stats, load_target("android"), {}, precision="int8")
    assert "\n" not in msg
    assert msg.startswith("target android cannot run 1 op(s) at int8: Log (node node_log); ConvTranspose (node "
                          "node_conv_transpose2d): ")
    assert "a limitation of edgekit's converter, not of the target" in msg
    assert op_refusal(stats, load_target("android"), {}, precision="fp32") is None  # the int8 list only


class LayerNormNet(nn.Module):
    """Each digit row is a token: Linear, a LayerNorm written out as paddle2onnx and older exporters write it
    (ReduceMean, Sub, Pow 2, ReduceMean, Add, Sqrt, Div), ReLU, the rows flattened, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.gamma = nn.Parameter(torch.ones(32))
        self.beta = nn.Parameter(torch.zeros(32))
        self.head = nn.Linear(8 * 32, 10)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        h = self.embed(rows)
        d = h - h.mean(dim=-1, keepdim=True)
        h = d / torch.sqrt((d ** 2).mean(dim=-1, keepdim=True) + 1e-5) * self.gamma + self.beta
        return self.head(torch.relu(h).flatten(1))


def _rows_onnx(model: nn.Module, path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``model`` trained on scikit-learn's digits read as 8 rows of 8 (a sequence), exported to ONNX the way
    paddle2onnx writes graphs (TorchScript exporter, opset 13); returns the train images and the held-out ones
    with their labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    x_tr, x_te, y_tr, y_te = train_test_split(x, d.target.astype(np.int64), test_size=0.25, random_state=0,
                                              stratify=d.target)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    for _ in range(30):
        for i in range(0, len(xt), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[i:i + 64]), yt[i:i + 64]).backward()
            opt.step()
    model.eval()
    torch.onnx.export(model, (torch.zeros(1, 8, 8),), str(path), input_names=["rows"], output_names=["logits"],
                      opset_version=13, dynamo=False)
    return x_tr, x_te, y_te


def _rows_int8(path, tmp_path, x_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, options=None):
    """The android INT8 build of a rows model, calibrated on 300 train digits, evaluated on the held-out ones."""
    np.savez(tmp_path / "calib.npz", rows=x_tr[:300])
    np.savez(tmp_path / "eval.npz", rows=x_te, label=y_te)
    return convert(str(path), "android", tmp_path / "int8", precision="int8", calib=str(tmp_path / "calib.npz"),
                   eval_data=str(tmp_path / "eval.npz"), options=options)


def test_layernorm_written_out_runs_fully_int8(tmp_path):
    """An ONNX LayerNorm of Pow / Sqrt / Div (none has a TFLite int8 kernel) was refused at int8; the converter
    now writes x**2 as MUL and a / sqrt(b) as a * RSQRT(b): the build is full-integer and keeps the accuracy of
    the float model on held-out digits. A Pow that is not a square stays refused."""
    import onnx

    from edgekit.analyze import analyze_onnx
    from edgekit.profiles import load_target

    torch.manual_seed(0)
    path = tmp_path / "ln.onnx"
    # the TorchScript exporter at opset 13 writes the graph as paddle2onnx does (ReduceMean's axes an attribute)
    x_tr, x_te, y_te = _rows_onnx(LayerNormNet(), path)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Pow", "Sqrt", "Div"} <= ops, ops
    android = load_target("android")
    assert analyze_onnx(path, android.supported_ops, "android", android.rewrites).unsupported == []
    assert {u["op"] for u in analyze_onnx(path, android.supported_ops, "android").unsupported} == {"Pow", "Sqrt",
                                                                                                   "Div"}
    res = _rows_int8(path, tmp_path, x_tr, x_te, y_te)
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == [], art
    assert art["op_counts"].get("RSQRT") == 1 and "POW" not in art["op_counts"] and "DIV" not in art["op_counts"]
    v = res.verification
    assert v.float_accuracy > 0.9 and v.passed, (v.float_accuracy, v.failures)
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0, (v.float_accuracy, v.converted_accuracy)

    cube = onnx.load(str(path))  # the same graph with x**3: no int8 rewrite, refused by name
    pow_exp = next(n.input[1] for n in cube.graph.node if n.op_type == "Pow")
    for t in [i for i in cube.graph.initializer if i.name == pow_exp] + [
            n.attribute[0].t for n in cube.graph.node if n.op_type == "Constant" and n.output[0] == pow_exp]:
        arr = onnx.numpy_helper.to_array(t)
        t.CopyFrom(onnx.numpy_helper.from_array(np.full(arr.shape, 3.0, arr.dtype), t.name))
    onnx.save(cube, str(tmp_path / "cube.onnx"))
    bad = analyze_onnx(tmp_path / "cube.onnx", android.supported_ops, "android", android.rewrites).unsupported
    assert [u["op"] for u in bad] == ["Pow"], bad


class Cascade(nn.Module):
    """openWakeWord's verifier cascade (an ONNX If on ``p1 >= 0.5``, which the ONNX bridge writes as a select):
    a first score, and where it fires, a second model's score instead."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 1), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p1 = torch.sigmoid(self.first(x))
        return torch.where(p1 >= 0.5, torch.sigmoid(self.second(x)), p1)


def test_comparison_and_select_run_int8(tmp_path):
    """GreaterOrEqual and Where have int8 kernels (GREATER_EQUAL takes int8 inputs, SELECT_V2 copies int8
    values at one shared scale): the cascade converts full-integer and matches the float model."""
    torch.manual_seed(0)
    model = Cascade().eval()
    path = tmp_path / "cascade.onnx"
    torch.onnx.export(model, (torch.zeros(1, 16),), str(path), input_names=["x"], output_names=["score"],
                      opset_version=13, dynamo=False)
    x = np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    res = convert(str(path), "android", tmp_path / "int8", precision="int8", calib=str(tmp_path / "calib.npz"),
                  output_kinds={"score": "regression"})
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == [], art
    assert art["op_counts"].get("GREATER_EQUAL") == 1 and art["op_counts"].get("SELECT", 0) + art["op_counts"].get(
        "SELECT_V2", 0) == 1, art["op_counts"]
    assert res.verification.passed, res.verification.failures


class UpNet(nn.Module):
    """A DB-style head (PP-OCR's text detector): features, a 2x2 stride-2 transposed conv up-sampling, a
    per-pixel probability map."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.head = nn.Conv2d(4, 1, 1)

    def forward(self, x):
        return torch.sigmoid(self.head(torch.relu(self.up(torch.relu(self.conv(x))))))


def test_upsampling_conv_transpose_converts_full_integer_as_conv_and_pixel_shuffle(tmp_path):
    """A ConvTranspose whose kernel equals its stride (PP-OCR's DB head) was refused on android at INT8
    (litert-torch lowers conv_transpose to a float TRANSPOSE_CONV even annotated). It is rewritten into a 1x1 conv
    to out x 4 channels and a pixel shuffle (RESHAPE / TRANSPOSE in the .tflite): the same values in float
    (checked here to 1e-5), full-integer in the .tflite, the map kept on real digits. A ConvTranspose with
    padding has no such rewrite and stays refused by name."""
    import onnx
    from edgekit.converters.tflite.int8_rewrites import transform
    from sklearn.datasets import load_digits

    from edgekit.analyze import analyze_onnx
    from edgekit.profiles import load_target

    torch.manual_seed(0)
    model = UpNet().eval()
    x = torch.from_numpy((load_digits().images[:, None] / 16.0).astype(np.float32))
    ep = torch.export.export(model, (x[:4],))
    gm = ep.module()
    assert transform(gm) == 1
    calls = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.conv_transpose2d.input" not in calls and "aten.pixel_shuffle.default" in calls, calls
    with torch.no_grad():
        assert all(torch.allclose(gm(x[i:i + 4]), model(x[i:i + 4]), atol=1e-5) for i in range(0, 64, 4))
    path = tmp_path / "up.onnx"
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), str(path), input_names=["image"], output_names=["map"],
                      opset_version=13, dynamo=False)
    android = load_target("android")
    assert analyze_onnx(path, android.supported_ops, "android", android.rewrites).unsupported == []
    np.savez(tmp_path / "calib.npz", image=x[:600].numpy())
    res = convert(str(path), "android", tmp_path / "int8", precision="int8", calib=str(tmp_path / "calib.npz"),
                  eval_data=str(tmp_path / "calib.npz"))
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == [], art
    # litert-torch lowers the pixel shuffle as RESHAPE / TRANSPOSE (int8, one shared scale), not DEPTH_TO_SPACE
    assert "TRANSPOSE_CONV" not in art["op_counts"] and art["op_counts"].get("TRANSPOSE"), art["op_counts"]
    assert res.verification.passed, res.verification.failures

    padded = onnx.load(str(path))
    node = next(n for n in padded.graph.node if n.op_type == "ConvTranspose")
    node.attribute.append(onnx.helper.make_attribute("pads", [1, 1, 0, 0]))
    onnx.save(padded, str(tmp_path / "padded.onnx"))
    bad = analyze_onnx(tmp_path / "padded.onnx", android.supported_ops, "android", android.rewrites).unsupported
    assert [u["op"] for u in bad] == ["ConvTranspose"], bad


class HeadsNet(nn.Module):
    """Multi-head self-attention over the 8 rows of a digit (SVTR's block, as PP-OCRv4's recogniser writes it):
    4-D [N, heads, T, d] matmuls around a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(8, 16)
        self.head = nn.Linear(16 * 8, 10)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        n = rows.shape[0]
        q, k, v = [t.reshape(n, 8, 2, 8).permute(0, 2, 1, 3) for t in (self.q(rows), self.k(rows), self.v(rows))]
        att = torch.softmax(torch.matmul(q, k.permute(0, 1, 3, 2)) * 0.35, dim=-1)
        return self.head(torch.matmul(att, v).permute(0, 2, 1, 3).reshape(n, 128))


def test_multi_head_attention_converts_full_integer(tmp_path):
    """An attention block with 4-D matmuls failed litert-torch's conversion at INT8 ("'tfl.reshape' op
    quantization parameters violate the same scale constraint", PP-OCRv4's recogniser): the matmul requantized the
    softmax's fixed 1/256 scale, and litert-torch lowers a 4-D matmul through RESHAPEs, which may not rescale. Its
    operands now keep their producers' scales: full-integer BATCH_MATMUL, the float model's accuracy kept."""
    torch.manual_seed(0)
    path = tmp_path / "heads.onnx"
    res = _rows_int8(path, tmp_path, *_rows_onnx(HeadsNet(), path))
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == [], art
    assert art["op_counts"].get("BATCH_MATMUL") == 2 and art["op_counts"].get("SOFTMAX") == 1, art["op_counts"]
    v = res.verification
    assert v.float_accuracy > 0.9 and v.passed, (v.float_accuracy, v.failures)
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0, (v.float_accuracy, v.converted_accuracy)


class RowsLSTM(nn.Module):
    """Each digit row is a time step: a bidirectional LSTM (ONNX LSTM, direction=bidirectional), its outputs
    averaged over time, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 24, batch_first=True, bidirectional=True)
        self.head = nn.Linear(48, 10)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(rows)[0].mean(dim=1))


def test_bidirectional_lstm_runs_fully_int8(tmp_path):
    """With ``--option lstm=int8`` TFLite runs an LSTM's steps with int8 kernels. edgekit writes the LSTM out step
    by step (torch's own decomposition) before PT2E: FULLY_CONNECTED, LOGISTIC, TANH, MUL, ADD, no float op. The
    per-step outputs' concatenations and the reverse direction's flip must keep their scales: left unannotated,
    the converter made them int8 at another tensor's scale and this model's held-out accuracy fell 20 points
    (96.2% -> 76.2%)."""
    torch.manual_seed(0)
    model = RowsLSTM()
    x_tr, x_te, y_te = _rows_onnx(model, tmp_path / "lstm.onnx")
    res = _rows_int8(tmp_path / "lstm.onnx", tmp_path, x_tr, x_te, y_te, options={"lstm": "int8"})
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == [], art
    assert art["quantization"]["lstm"].startswith("int8 (1 LSTM"), art["quantization"]
    ops = art["op_counts"]
    assert ops.get("LOGISTIC", 0) >= 3 * 8 * 2 and ops.get("TANH", 0) >= 2 * 8 * 2, ops  # 3 gates + 2 tanh, per step
    assert ops.get("REVERSE_V2", 0) >= 1, ops
    v = res.verification
    assert v.float_accuracy > 0.9, v.float_accuracy
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 2.0, (v.float_accuracy, v.converted_accuracy)
    assert v.passed, v.failures


def test_lstms_stay_float_by_default_and_other_float_ops_are_still_refused(tmp_path):
    """By default an int8 build keeps every LSTM float between DEQUANTIZE and QUANTIZE (as jetson's and ios' INT8
    builds run them), said in the manifest; the embedding and head stay int8, and no float group step is needed.
    An op with no TFLite int8 kernel beside the LSTM (here a Log) is still refused, before any build."""
    from edgekit.errors import UnsupportedOpError

    class RowsLSTMLog(RowsLSTM):
        def forward(self, x):
            return torch.log(super().forward(x).abs() + 1.0)

    torch.manual_seed(0)
    x_tr, x_te, y_te = _rows_onnx(RowsLSTM(), tmp_path / "lstm.onnx")
    res = _rows_int8(tmp_path / "lstm.onnx", tmp_path, x_tr, x_te, y_te)
    art = res.manifest["artifact"]
    float_ops = {o["op"] for o in art["float_ops"]}
    assert art["full_integer"] is False and {"DEQUANTIZE", "LOGISTIC", "TANH"} <= float_ops, float_ops
    assert art["quantization"]["lstm"].startswith("float (1 LSTM"), art["quantization"]
    assert "mixed_precision" not in art, art.get("mixed_precision")
    assert any("float LSTMs (--option lstm=int8" in n for n in res.notes), res.notes
    assert res.verification.passed, res.verification.failures
    _rows_onnx(RowsLSTMLog(), tmp_path / "log.onnx")
    with pytest.raises(UnsupportedOpError, match=r"cannot run .* at int8: .*Log"):
        convert(str(tmp_path / "log.onnx"), "android", tmp_path / "log", precision="int8",
                calib=str(tmp_path / "calib.npz"))
    assert not (tmp_path / "log").exists()


class ScoresHead(nn.Module):
    """A YOLOX-style head: box offsets concatenated with sigmoid scores (ddddocr's detector)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Conv2d(1, 8, 3, padding=1)
        self.box, self.obj, self.cls = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 1, 1), nn.Conv2d(8, 3, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        f = torch.relu(self.body(image))
        out = torch.cat([self.box(f), self.obj(f).sigmoid(), self.cls(f).sigmoid()], 1)
        return out.flatten(2).permute(0, 2, 1)


def test_sigmoid_scores_concatenated_with_boxes_run_on_the_builtin_kernels(tmp_path):
    """TFLite's int8 LOGISTIC writes at a fixed scale (1/256) and CONCATENATION takes every input at its own
    output's: the scores must be requantized first. litert-torch dropped that requantization and the conversion
    failed ("'tfl.concatenation' op quantization parameters violate the same scale constraint": ddddocr's
    detector). Sharing the concatenation's scale with the LOGISTIC instead converts and runs on XNNPACK, but
    TFLite's own kernel refuses it ("output->params.scale == 1. / 256 was not true"). The converter puts a RELU
    between them (exact on a sigmoid's output; the int8 RELU rescales): the build is full-integer and loads and
    runs on the builtin kernels (NNAPI-less devices, the reference) as on XNNPACK, with the same outputs."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = ScoresHead().eval()
    torch.onnx.export(model, (torch.zeros(1, 1, 8, 8),), str(tmp_path / "head.onnx"), input_names=["image"],
                      output_names=["out"], opset_version=11, dynamo=False)
    np.savez(tmp_path / "calib.npz", image=rng.random((200, 1, 8, 8), dtype=np.float32))
    res = convert(str(tmp_path / "head.onnx"), "android", tmp_path / "int8", precision="int8",
                  calib=str(tmp_path / "calib.npz"), eval_data=str(tmp_path / "calib.npz"), cache=False)
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["op_counts"].get("RELU") == 2, art["op_counts"]
    assert art["builtin_kernels"] == "load", art["builtin_kernels"]  # checked at every build, said when refused
    assert res.verification.passed, res.verification.failures
    outs, x = [], None
    for resolver in (OpResolverType.AUTO, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
        it = Interpreter(str(res.out_dir / "model.tflite"), experimental_op_resolver_type=resolver)
        it.allocate_tensors()  # the builtin LOGISTIC checks its output scale here
        d = it.get_input_details()[0]
        if x is None:  # the same int8 input for both
            scale, zero = d["quantization"]
            x = np.clip(np.round(rng.random(d["shape"]) / scale + zero), -128, 127).astype(d["dtype"])
        it.set_tensor(d["index"], x)
        it.invoke()
        outs.append(it.get_tensor(it.get_output_details()[0]["index"]).astype(np.int32))
    assert np.abs(outs[0] - outs[1]).max() <= 1, np.abs(outs[0] - outs[1]).max()
    # the check itself: the same model with a LOGISTIC writing at another scale (what sharing the concatenation's
    # scale gave) is named as refused by the builtin kernels
    from edgekit.converters.tflite.interpreter import builtin_refusal as _builtin_refusal

    from edgekit.tflite_graph import TFLiteGraph

    g = TFLiteGraph(res.out_dir / "model.tflite")
    out = next(o[0] for name, _, o in g.operators() if name == "LOGISTIC")
    g.sg.tensors[out].quantization.scale = [0.01]
    g.save(tmp_path / "bad.tflite")
    assert "LOGISTIC" in (_builtin_refusal(tmp_path / "bad.tflite") or ""), _builtin_refusal(tmp_path / "bad.tflite")


class IntScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(8, 16)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([torch.relu(self.a(x)), 20 * torch.relu(self.b(x))], -1))


def test_integer_scalar_in_float_arithmetic_of_a_pt2(tmp_path):
    """``20 * x`` in a .pt2 program: PT2E lifts the 20 into an int64 constant, and edgekit's add / mul
    annotation put a histogram observer on it (a traceback: "histogram_cpu" not implemented for 'Long')."""
    torch.manual_seed(0)
    torch.export.save(torch.export.export(IntScale().eval(), (torch.zeros(1, 8),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32))
    res = convert(str(tmp_path / "m.pt2"), "android", tmp_path / "int8", precision="int8",
                  calib=str(tmp_path / "calib.npz"))
    assert res.manifest["artifact"]["full_integer"] is True
    assert res.verification.passed, res.verification.failures


class SmallWeights(nn.Module):
    """A detector head's shape: large features (+-1000, as an FPN concat carries) read by a conv whose weights are
    all under 2e-4 (a BatchNorm folded in), its output a few units."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.feat = nn.Conv2d(1, 16, 3, padding=1)
        self.head = nn.Conv2d(16, 4, 3, padding=1)
        with torch.no_grad():
            self.feat.weight.mul_(1000.0)
            self.head.weight.copy_(torch.randn(4, 16, 3, 3, generator=g) * 5e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.feat(x)))


def test_small_weights_keep_their_resolution(tmp_path):
    """litert-torch's config floors every weight scale at 2**-12 (2.4e-4): weights under 1.2e-4 rounded to 0 and
    +-1, and PP-OCRv4's detector head lost its mask (IoU 0.00 on android and ios). edgekit gives the weights
    float32's eps instead (TFLite has no floor): this head stays within the int8 tolerance (with the floor its
    output SNR is under 10 dB, checked here on the same fake-quant program)."""
    import copy

    from edgekit.converters.tflite.quantizer import pt2e_quantizer as _quantizer
    from torchao.quantization.pt2e import quantize_pt2e

    torch.manual_seed(0)
    net = SmallWeights().eval()
    x = np.random.default_rng(0).uniform(0, 1, size=(120, 1, 8, 8)).astype(np.float32)
    torch.export.save(torch.export.export(net, (torch.from_numpy(x[:1]),)), tmp_path / "m.pt2")
    np.savez(tmp_path / "calib.npz", x=x)
    res = convert(str(tmp_path / "m.pt2"), "android", tmp_path / "int8", precision="int8",
                  calib=str(tmp_path / "calib.npz"), strict=True)
    assert res.manifest["artifact"]["full_integer"] is True
    assert res.verification.passed, res.verification.failures

    def snr(quantizer) -> float:
        gm = torch.export.export(net, (torch.from_numpy(x[:1]),)).module()
        p = quantize_pt2e.prepare_pt2e(copy.deepcopy(gm), quantizer)
        with torch.no_grad():
            for i in range(0, 60):
                p(torch.from_numpy(x[i:i + 1]))
            q = quantize_pt2e.convert_pt2e(p)
            ref = torch.cat([gm(torch.from_numpy(x[i:i + 1])) for i in range(60, 120)])
            got = torch.cat([q(torch.from_numpy(x[i:i + 1])) for i in range(60, 120)])
        return float(10 * torch.log10((ref ** 2).sum() / ((got - ref) ** 2).sum()))

    floored = _quantizer(False, "minmax")
    import dataclasses

    from torchao.quantization.pt2e import PerChannelMinMaxObserver

    cfg = floored.global_config
    floored.set_global(dataclasses.replace(cfg, weight=dataclasses.replace(
        cfg.weight, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2 ** -12))))
    assert snr(_quantizer(False, "minmax")) > 30 > 10 > snr(floored)


class ReversedRows(nn.Module):
    """A conv, the feature map's rows read bottom to top by ``index_select`` with a constant index (what the ONNX
    bridge makes of a Slice with step -1, Silero VAD's reflection padding of its spectrogram), a conv, a Linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.conv2, self.head = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Linear(8, 10)
        self.register_buffer("rows", torch.arange(7, -1, -1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(image))
        x = torch.index_select(x, 2, self.rows)
        return self.head(torch.relu(self.conv2(x)).mean(dim=(2, 3)))


def test_index_select_with_a_constant_index_is_an_int8_gather(ops_digits, tmp_path):
    """Gather (index_select) is no longer refused at int8: its values are copied at its input's scale, and the
    GATHER_ND litert-torch lowers it to runs on int8 tensors (audited), with no QUANTIZE / DEQUANTIZE around it."""
    from edgekit.converters.tflite.audit import audit

    model = ReversedRows().eval()
    torch.export.save(torch.export.export(model, (torch.zeros(1, 1, 8, 8),)), tmp_path / "rev.pt2")
    res = convert(str(tmp_path / "rev.pt2"), "android", tmp_path / "int8", precision="int8",
                  calib=str(ops_digits / "calib.npz"), cache=False, fail_on_verification=False)
    art = res.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == [] and art["op_counts"].get("GATHER_ND") == 1
    assert "QUANTIZE" not in art["op_counts"] and "DEQUANTIZE" not in art["op_counts"]
    gather = next(o for o in audit(res.out_dir / "model.tflite")["ops"] if o["op"] == "GATHER_ND")
    assert "INT8" in gather["types"] and "FLOAT32" not in gather["types"], gather
