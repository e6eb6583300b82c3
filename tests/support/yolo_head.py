"""A small YOLOv8-style detector built and trained in the tests (scikit-learn's digits as 32x32 RGB images).

It has what made Ultralytics' YOLOv8 exports fail on android and ios: a C2f block's ``split`` (ONNX Split with
its sizes as an input tensor), the DFL head (Reshape, Transpose, Softmax, a fixed 1x1 conv), ``dist2bbox``'s
``chunk`` (Shape -> Gather -> Div -> Slice in the legacy exporter's graph), a constant anchor grid and the
head's ``Concat(boxes, sigmoid(class scores))`` on axis 1: the output is [N, 4 + C, anchors], channels first and
no objectness. Its class scores are fitted to the digits' ink (class = digit % 3), so the float model detects
something and the conversions are judged on real detections.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

CLASSES = 3
REG_MAX = 4
SIZE = 32


def silu_conv(cin: int, cout: int, k: int = 3, s: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2), nn.SiLU())


class C2f(nn.Module):
    """Ultralytics' C2f at one bottleneck: split in two, one half through a conv, all three concatenated."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1, self.m, self.cv2 = silu_conv(c, 2 * c, 1), silu_conv(c, c), silu_conv(3 * c, c, 1)
        self.c = c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.cv1(x).split((self.c, self.c), 1)
        return self.cv2(torch.cat([a, b, self.m(b)], 1))


class TinyYOLOv8(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.c2f = silu_conv(3, 16, s=2), C2f(16)  # stride 2: 16x16
        self.down = silu_conv(16, 16, s=2)  # stride 4: 8x8
        self.box = nn.ModuleList(nn.Conv2d(16, 4 * REG_MAX, 1) for _ in range(2))
        self.cls = nn.ModuleList(nn.Conv2d(16, CLASSES, 1) for _ in range(2))
        self.dfl = nn.Conv2d(REG_MAX, 1, 1, bias=False).requires_grad_(False)
        self.dfl.weight.data[:] = torch.arange(REG_MAX, dtype=torch.float32).view(1, REG_MAX, 1, 1)
        anchors, strides = [], []
        for size, stride in ((SIZE // 2, 2), (SIZE // 4, 4)):
            y, x = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
            anchors.append(torch.stack([x, y]).reshape(2, -1))
            strides.append(torch.full((1, size * size), float(stride)))
        self.register_buffer("anchors", torch.cat(anchors, 1))
        self.register_buffer("strides", torch.cat(strides, 1))

    def logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p2 = self.c2f(self.stem(x))
        levels = (p2, self.down(p2))
        box = torch.cat([b(f).flatten(2) for b, f in zip(self.box, levels)], 2)
        cls = torch.cat([c(f).flatten(2) for c, f in zip(self.cls, levels)], 2)
        return box, cls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box, cls = self.logits(x)
        n, _, a = box.shape
        dist = self.dfl(box.view(n, 4, REG_MAX, a).transpose(2, 1).softmax(1)).view(n, 4, a)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = self.anchors - lt, self.anchors + rb
        dbox = torch.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], 1) * self.strides
        return torch.cat([dbox, cls.sigmoid()], 1)


def digits_rgb(n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as [N, 3, 32, 32] float32 in [0, 1] (each pixel 4x4), and their labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    x = np.kron(x, np.ones((4, 4), np.float32))[:, None].repeat(3, axis=1)
    return (x[:n], d.target[:n]) if n else (x, d.target)


def trained(n: int = 300) -> TinyYOLOv8:
    """The detector with its class-score convs fitted (least squares, one solve: seconds on a busy CPU) over the
    fixed random features to logits of +4 on the digits' ink and -4 elsewhere, so its anchors on ink detect
    (class = digit % 3); its boxes keep their initial regression (the conversion must keep them)."""
    torch.manual_seed(0)
    x, y = digits_rgb(n)
    x_t = torch.from_numpy(x)
    model = TinyYOLOv8().eval()
    with torch.no_grad():
        p2 = model.c2f(model.stem(x_t))
        for conv, f, s in zip(model.cls, (p2, model.down(p2)), (2, 4)):
            ink = nn.functional.avg_pool2d(x_t[:, :1], s).flatten(1) > 0.4  # [N, anchors of this level]
            feats = torch.cat([f.flatten(2).transpose(1, 2), torch.ones(n, ink.shape[1], 1)], 2).reshape(-1, 17)
            for c in range(CLASSES):
                want = torch.where(ink & torch.from_numpy(y % CLASSES == c)[:, None], 4.0, -4.0).reshape(-1, 1)
                w = torch.linalg.lstsq(feats.double(), want.double()).solution.float().reshape(-1)
                conv.weight[c] = w[:16].view(16, 1, 1)
                conv.bias[c] = w[16]
    return model


class TinyYOLOv5(nn.Module):
    """YOLOv5's anchor-based head on the same backbone: per level a 1x1 conv to anchors x (4 box + objectness + C),
    sigmoid, ``split`` into xy / wh / scores, decoded to pixels (xy against the grid, wh against the anchor
    sizes), concatenated per level on the last axis and over the levels: [N, anchors, 5 + C]."""

    NA = 2
    NO = 5 + CLASSES

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.c2f = silu_conv(3, 16, s=2), C2f(16)
        self.down = silu_conv(16, 16, s=2)
        self.head = nn.ModuleList(nn.Conv2d(16, self.NA * self.NO, 1) for _ in range(2))
        self.strides = (2, 4)
        for i, (size, stride) in enumerate(((SIZE // 2, 2), (SIZE // 4, 4))):
            y, x = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
            self.register_buffer(f"grid{i}", torch.stack([x, y], -1).float().view(1, 1, size, size, 2) - 0.5)
            self.register_buffer(f"anchor{i}", torch.tensor([[2.0, 3.0], [5.0, 4.0]]).mul(stride / 2)
                                 .view(1, self.NA, 1, 1, 2))

    def levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p2 = self.c2f(self.stem(x))
        return p2, self.down(p2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = []
        for i, (conv, f) in enumerate(zip(self.head, self.levels(x))):
            y = conv(f)
            n, _, h, w = y.shape
            y = y.view(n, self.NA, self.NO, h, w).permute(0, 1, 3, 4, 2).sigmoid()
            xy, wh, conf = y.split((2, 2, self.NO - 4), 4)
            xy = (xy * 2 + getattr(self, f"grid{i}")) * self.strides[i]
            wh = (wh * 2) ** 2 * getattr(self, f"anchor{i}")
            z.append(torch.cat((xy, wh, conf), 4).view(n, -1, self.NO))
        return torch.cat(z, 1)


def trained_v5(n: int = 300) -> TinyYOLOv5:
    """The YOLOv5-style detector with its objectness and class channels fitted as :func:`trained` fits
    YOLOv8's class scores: objectness +4 on ink, each class +4 on the ink of its digits (digit % 3)."""
    torch.manual_seed(0)
    x, y = digits_rgb(n)
    x_t = torch.from_numpy(x)
    model = TinyYOLOv5().eval()
    with torch.no_grad():
        for conv, f, s in zip(model.head, model.levels(x_t), model.strides):
            ink = nn.functional.avg_pool2d(x_t[:, :1], s).flatten(1) > 0.4
            feats = torch.cat([f.flatten(2).transpose(1, 2), torch.ones(n, ink.shape[1], 1)], 2).reshape(-1, 17)
            wants = {4: ink} | {5 + c: ink & torch.from_numpy(y % CLASSES == c)[:, None] for c in range(CLASSES)}
            for k, on in wants.items():
                want = torch.where(on, 4.0, -4.0).reshape(-1, 1)
                w = torch.linalg.lstsq(feats.double(), want.double()).solution.float().reshape(-1)
                for a in range(model.NA):
                    conv.weight[a * model.NO + k] = w[:16].view(16, 1, 1)
                    conv.bias[a * model.NO + k] = w[16]
    return model


def export(model: nn.Module, path) -> None:
    """The legacy exporter at opset 17, as Ultralytics exports (Split sizes as an input, chunk as Shape/Slice)."""
    torch.onnx.export(model, (torch.zeros(1, 3, SIZE, SIZE),), str(path), input_names=["images"],
                      output_names=["output0"], opset_version=17, dynamo=False)
