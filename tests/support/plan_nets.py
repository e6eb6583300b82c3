"""Small torch networks for the planner tests (importable as ``plan_nets:factory``)."""

from __future__ import annotations

import torch
from torch import nn


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hid = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6()]
        layers += [nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid), nn.ReLU6(),
                   nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.res = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.res else self.conv(x)


def _c(x: float, width: float) -> int:
    return max(8, int(x * width + 4) // 8 * 8)


class MobileNetV2(nn.Module):
    """MobileNetV2's block layout (t, c, n, s) at a reduced width: residual adds, depthwise convs."""

    def __init__(self, width: float = 0.35, classes: int = 10) -> None:
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
        cin = _c(32, width)
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin), nn.ReLU6()]
        for t, c, n, s in cfg:
            cout = _c(c, width)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = 1280 if width <= 1 else _c(1280, width)
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, classes)

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def mobilenetv2():
    torch.manual_seed(0)
    return MobileNetV2().eval()


def digits():
    """The digits example as an nn.Module (its trained weights from digits_cnn.pt2): prunable."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "digits"
    spec = importlib.util.spec_from_file_location("digits_train", root / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    net = mod.DigitsCNN()
    net.load_state_dict(torch.export.load(str(root / "digits_cnn.pt2")).state_dict)
    return net.eval()


def digits_int8_fragile():
    """The digits network with one layer that per-channel INT8 cannot hold: its float accuracy stays
    close to the trained one (96.0% vs 98.4%), its INT8 build loses most of it, and keeping the head
    in float wins it back. Feature 0 of the head's input is made always zero (channel 0 switched off before the
    residual ReLU), then each head row gets a weight of 1000 on that feature: the float function
    does not see it, but each row's INT8 scale becomes 1000/127 and its real weights round to 0."""
    net = digits()
    with torch.no_grad():
        net.conv[1].weight[0], net.conv[1].bias[0] = 0.0, -1.0  # x_0 = relu(-1) = 0
        net.res[1].weight[0], net.res[1].bias[0] = 0.0, -1.0  # relu(x_0 + res_0) = relu(-1) = 0
        net.head.weight[:, 0] = 1000.0
    return net.eval()



class TwoHeads(nn.Module):
    """The digits network's trunk with two heads, as face detectors have: ``box`` [N, 4] (a regression: the
    ink's bounding box in the 8x8 image, 0..1) first, then ``prob`` [N, 10] (class probabilities, softmax)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.box = nn.Linear(32, 4)
        self.cls = nn.Linear(32, 10)

    def forward(self, x):
        h = self.trunk(x)
        return self.box(h), torch.softmax(self.cls(h), dim=1)


def ink_box(x: torch.Tensor) -> torch.Tensor:
    """Bounding box (row0, col0, row1, col1) / 8 of the pixels above the image mean: the regression target."""
    img = x[:, 0]
    on = img > img.mean(dim=(1, 2), keepdim=True)
    rows, cols = on.any(dim=2).float(), on.any(dim=1).float()
    idx = torch.arange(8, dtype=torch.float32)
    first = lambda m: (m * (8 - idx)).argmax(dim=1).float()  # noqa: E731 - first True
    last = lambda m: (m * (idx + 1)).argmax(dim=1).float()  # noqa: E731 - last True
    return torch.stack([first(rows), first(cols), last(rows), last(cols)], dim=1) / 8


def two_heads(steps: int = 400) -> nn.Module:
    """TwoHeads trained on scikit-learn's digits (through the example's calib + eval files): about 1 s."""
    from pathlib import Path

    import numpy as np

    root = Path(__file__).resolve().parents[2] / "examples" / "digits"
    with np.load(root / "eval.npz") as z:
        x, y = torch.from_numpy(z["image"]), torch.from_numpy(z["label"]).long()
    torch.manual_seed(0)
    net = TwoHeads()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    box = ink_box(x)
    for _ in range(steps):
        b, p = net(x)
        loss = nn.functional.nll_loss(torch.log(p + 1e-9), y) + 10 * nn.functional.mse_loss(b, box)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval()
