"""A MobileNetV2-shaped network (inverted residuals, depthwise convs, ReLU6), small enough for tests.

Same block structure as torchvision's MobileNetV2 (which cannot be imported beside the CPU
torch here, see TOOLCHAIN.md), with a width multiplier and a 32x32 input.
"""

from __future__ import annotations

import torch
from torch import nn

# (expansion t, channels c, repeats n, stride s) from the MobileNetV2 paper, Table 2
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _div8(v: float) -> int:
    return max(8, int(v + 4) // 8 * 8)


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU6())


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
        super().__init__()
        hidden = cin * t
        layers: list[nn.Module] = [] if t == 1 else [ConvBNReLU(cin, hidden, 1)]
        layers += [ConvBNReLU(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2Small(nn.Module):
    def __init__(self, width: float = 0.5, classes: int = 10) -> None:
        super().__init__()
        c = _div8(32 * width)
        layers: list[nn.Module] = [ConvBNReLU(3, c, 3, 1)]  # stride 1 stem for 32x32 inputs
        for t, ch, n, s in SETTINGS:
            out = _div8(ch * width)
            for i in range(n):
                layers.append(InvertedResidual(c, out, s if i == 0 else 1, t))
                c = out
        last = _div8(1280 * max(1.0, width))
        layers.append(ConvBNReLU(c, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(image)), 1))


def build(width: float = 0.5, seed: int = 0) -> MobileNetV2Small:
    """Random weights, BatchNorm statistics settled on random data (so outputs depend on the input)."""
    torch.manual_seed(seed)
    model = MobileNetV2Small(width)
    model.train()
    with torch.no_grad():
        for _ in range(8):
            model(torch.rand(16, 3, 32, 32))
    return model.eval()


def export(path, width: float = 0.5) -> None:
    model = build(width)
    ep = torch.export.export(model, (torch.rand(1, 3, 32, 32),))
    torch.export.save(ep, str(path))

