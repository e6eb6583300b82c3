"""The MLPerf Tiny reference architectures at the input size of scikit-learn's digits (1x8x8): what people put on a
Zynq, in the shapes the fabric path must take (residual adds with 1x1-conv shortcuts, depthwise-separable blocks,
BatchNorm, average pooling, a fully connected autoencoder). ``train.py`` trains them on the digits example's split.

- ``resnet8``: MLPerf Tiny image classification (ResNet-8: a 16-ch stem, three residual stacks of 16/32/64 channels,
  stride-2 stacks with 1x1-conv shortcuts, global average pool, dense 10).
- ``dscnn``: keyword spotting's DS-CNN (a strided stem conv, four depthwise 3x3 + pointwise blocks, each with
  BatchNorm and ReLU, average pool, dense); ``width`` channels (the reference: 64).
- ``autoencoder``: anomaly detection's fully connected autoencoder (dense 128 x 4, bottleneck 8, dense 128 x 4,
  BatchNorm + ReLU after each hidden layer), reconstructing the 64 pixels.
- ``mobilenet_v1``: visual wake words' MobileNetV1 (alpha 0.25) at 96x96x3, untrained: it is there to be refused
  for size with the figures.
"""

from __future__ import annotations

import torch
from torch import nn


def _cbr(cin, cout, k=3, s=1, groups=1):
    return [nn.Conv2d(cin, cout, k, s, padding=k // 2 if isinstance(k, int) else (k[0] // 2, k[1] // 2),
                      groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class _Stack(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(*_cbr(cin, cout, 3, stride), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.body(x) + self.short(x))


class ResNet8(nn.Module):
    def __init__(self, classes=10, widths=(16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(*_cbr(1, widths[0]))
        self.s1 = _Stack(widths[0], widths[0], 1)
        self.s2 = _Stack(widths[0], widths[1], 2)
        self.s3 = _Stack(widths[1], widths[2], 2)
        self.fc = nn.Linear(widths[2], classes)

    def forward(self, x):
        x = self.s3(self.s2(self.s1(self.stem(x))))
        return self.fc(x.mean((2, 3)))


class DSCNN(nn.Module):
    """``stem``/``stem_stride``: the first conv (MLPerf Tiny's KWS: 10x4, stride 2 over 49x10 MFCCs); ``pool``: an
    average pool of that size (the 8x8 digits), or None for the mean over whatever the blocks leave."""

    def __init__(self, classes=10, width=64, blocks=4, stem=(3, 3), stem_stride=1, pool=8):
        super().__init__()
        layers = _cbr(1, width, stem, stem_stride)
        for _ in range(blocks):
            layers += _cbr(width, width, 3, 1, groups=width) + _cbr(width, width, 1)
        self.features = nn.Sequential(*layers, *([nn.AvgPool2d(pool)] if pool else []))
        self.pool = pool
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = self.features(x)
        return self.fc(torch.flatten(x, 1) if self.pool else x.mean((2, 3)))


class AutoEncoder(nn.Module):
    def __init__(self, n=64, hidden=128, bottleneck=8):
        super().__init__()

        def block(i, o):
            return [nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU()]

        layers = block(n, hidden) + block(hidden, hidden) + block(hidden, hidden) + block(hidden, hidden)
        layers += block(hidden, bottleneck)
        layers += block(bottleneck, hidden) + block(hidden, hidden) + block(hidden, hidden) + block(hidden, hidden)
        self.net = nn.Sequential(*layers, nn.Linear(hidden, n))

    def forward(self, x):
        return self.net(torch.flatten(x, 1))


class MobileNetV1(nn.Module):
    def __init__(self, alpha=0.25, classes=2):
        super().__init__()
        c = [int(32 * alpha * m) for m in (1, 2, 4, 4, 8, 8, 16, 16, 16, 16, 16, 16, 32, 32)]
        strides = [1, 2, 1, 2, 1, 2, 1, 1, 1, 1, 1, 2, 1]
        layers = _cbr(3, c[0], 3, 2)
        for i, s in enumerate(strides):
            layers += _cbr(c[i], c[i], 3, s, groups=c[i]) + _cbr(c[i], c[i + 1], 1)
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c[-1], classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))
