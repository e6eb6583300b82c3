"""Small MobileNetV2-shaped network for the Android/TFLite tests and benchmark.

Inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, residual ADD where the
shape allows), with two consecutive residual blocks at one width so that one residual
ADD feeds the next ADD directly: the pattern that litert-torch's default PT2E config
leaves in float. Trained for a few seconds on scikit-learn's digits (8x8 upsampled to
``size`` x ``size``, 3 channels) so that accuracy and top-1 agreement mean something.

The trained model is committed as examples/mbv2_digits/mbv2.pt2 (``python bench/android_nets.py``
rewrites it); tests regenerate its calib/eval data with :func:`write_data`.
"""

from __future__ import annotations

import numpy as np


def _build(width: int = 16):
    import torch
    from torch import nn

    class ConvBNReLU(nn.Sequential):
        def __init__(self, cin, cout, k=3, stride=1, groups=1):
            super().__init__(
                nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU6(inplace=False),
            )

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hid = cin * expand
            self.use_res = stride == 1 and cin == cout
            self.conv = nn.Sequential(
                ConvBNReLU(cin, hid, 1),
                ConvBNReLU(hid, hid, 3, stride, groups=hid),
                nn.Conv2d(hid, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MBv2Tiny(nn.Module):
        def __init__(self, classes: int = 10):
            super().__init__()
            w = width
            self.features = nn.Sequential(
                ConvBNReLU(3, w, 3, 2),
                InvertedResidual(w, w, 1, 1),
                InvertedResidual(w, 2 * w, 2, 4),
                InvertedResidual(2 * w, 2 * w, 1, 4),  # residual
                InvertedResidual(2 * w, 2 * w, 1, 4),  # residual fed by a residual ADD
                InvertedResidual(2 * w, 2 * w, 1, 4),  # and another
                ConvBNReLU(2 * w, 4 * w, 1),
            )
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Linear(4 * w, classes)

        def forward(self, image):
            x = self.pool(self.features(image))
            return self.classifier(torch.flatten(x, 1))

    return MBv2Tiny()


def digits_rgb(size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn digits as [N, 3, size, size] float32 in [0, 1], and labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    rep = size // 8
    x = np.repeat(np.repeat(x, rep, axis=1), rep, axis=2)
    x = np.stack([x, x * 0.8, x * 0.6], axis=1).astype(np.float32)
    return x, d.target.astype(np.int64)


def split(size: int = 16, seed: int = 0):
    """(train x, train y, calib [200,3,s,s], eval x, eval y): a fixed split of scikit-learn's digits."""
    x, y = digits_rgb(size)
    idx = np.random.default_rng(seed).permutation(len(x))
    tr, te = idx[:1300], idx[1300:]
    return x[tr], y[tr], x[tr[:200]], x[te], y[te]


def write_data(folder, size: int = 16, seed: int = 0):
    """calib.npz and eval.npz for the committed model (regenerated from scikit-learn's digits)."""
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _, _, calib, ex, ey = split(size, seed)
    np.savez(folder / "calib.npz", image=calib)
    np.savez(folder / "eval.npz", image=ex, label=ey)
    return folder / "calib.npz", folder / "eval.npz"


def trained_mbv2(size: int = 16, epochs: int = 6, seed: int = 0):
    """(model in eval mode, calib [200,3,s,s], eval images, eval labels)."""
    import torch

    torch.manual_seed(seed)
    xtr, ytr, calib, ex, ey = split(size, seed)
    model = _build()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            b = perm[i : i + 64]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xt[b]), yt[b])
            loss.backward()
            opt.step()
    model.eval()
    return model, calib, ex, ey


def save_mbv2(folder, size: int = 16):
    """Write mbv2.pt2 (torch.export, batch 1), calib.npz and eval.npz into ``folder``."""
    from pathlib import Path

    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, calib, ex, ey = trained_mbv2(size)
    ep = torch.export.export(model, (torch.from_numpy(calib[:1]),))
    torch.export.save(ep, str(folder / "mbv2.pt2"))
    write_data(folder, size)
    with torch.no_grad():
        acc = float((model(torch.from_numpy(ex)).argmax(1).numpy() == ey).mean())
    return folder / "mbv2.pt2", acc


if __name__ == "__main__":
    from pathlib import Path

    path, acc = save_mbv2(Path(__file__).resolve().parents[1] / "examples" / "mbv2_digits")
    for f in ("calib.npz", "eval.npz"):
        (path.parent / f).unlink()
    print(f"wrote {path} (float eval accuracy {acc:.2%})")
