"""Train the digits example: a small CNN on scikit-learn's 8x8 handwritten digits.

Writes, next to this file:
  digits_cnn.pt2   torch.export ExportedProgram, input "image" float32 [1, 1, 8, 8]
  calib.npz        200 training images (key "image"), for INT8 calibration
  eval.npz         the held-out split: "image" [N, 1, 8, 8] and "label" [N]

Real data that ships offline (sklearn.datasets.load_digits); runs in ~10 s on 2 cores.
    python examples/digits/train.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

HERE = Path(__file__).resolve().parent


class DigitsCNN(nn.Module):
    """Conv-BN-ReLU x2, a residual conv, global pooling, linear head (10 classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.conv = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.res = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32))
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.stem(image))
        x = self.relu(x + self.res(x))
        return self.head(torch.flatten(self.pool(x), 1))


def load_split(seed: int = 0):
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # [N,1,8,8] in [0,1]
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()

    torch.manual_seed(0)
    x_tr, x_te, y_tr, y_te = load_split()
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    for epoch in range(args.epochs):
        model.train()
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean()
    print(f"test accuracy: {acc:.4f} on {len(y_te)} images")

    args.out.mkdir(parents=True, exist_ok=True)
    ep = torch.export.export(model, (torch.zeros(1, 1, 8, 8),))
    torch.export.save(ep, args.out / "digits_cnn.pt2")
    np.savez(args.out / "calib.npz", image=x_tr[:200])
    np.savez(args.out / "eval.npz", image=x_te, label=y_te)
    print(f"wrote {args.out / 'digits_cnn.pt2'}, calib.npz, eval.npz")


if __name__ == "__main__":
    main()
