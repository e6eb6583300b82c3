"""Android full-integer INT8 beyond litert-torch's own annotators: a digits CNN trained here (scikit-learn
digits) with PReLU, HardSwish, a BatchNorm after a ReLU, LeakyReLU, Pad, a nearest Resize and a Sub by a
constant. Every one of those has an int8 kernel in TFLite; edgekit annotates or rewrites them
(converters/tflite_int8.py). The build must be fully int8 (every op's tensors audited) and keep the float
model's accuracy on the held-out digits."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from edgekit.pipeline import convert  # noqa: E402


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
    from edgekit.converters.tflite import audit

    art = ops_int8.manifest["artifact"]
    assert art["full_integer"] is True and art["float_ops"] == []
    ops = art["op_counts"]
    # TFLite's own int8 kernels for the activations; BN and PReLU's slopes are depthwise conv weights
    for op in ("HARD_SWISH", "LEAKY_RELU", "PAD", "RESIZE_NEAREST_NEIGHBOR", "DEPTHWISE_CONV_2D"):
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

    stats = SimpleNamespace(unsupported=[{"op": "LSTM", "node": "node_lstm"}, {"op": "Log", "node": "node_log"}])
    msg = op_refusal(stats, load_target("android"), {}, precision="int8")
    assert "\n" not in msg
    assert msg.startswith("target android cannot run 1 op(s) at int8: Log (node node_log); LSTM (node node_lstm): ")
    assert "a limitation of edgekit's converter, not of the target" in msg
    assert op_refusal(stats, load_target("android"), {}, precision="fp32") is None  # the int8 list only
