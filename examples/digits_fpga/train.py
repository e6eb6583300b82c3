"""Train the FPGA-sized digits models on the digits example's split (scikit-learn digits).

The fabric wants tiny models: every weight becomes a multiplier (or a LUT multiplier at
8 bits and below), and hls4ml's C simulation is compiled with g++. Writes, next to this file:
  digits_mlp.pt2   Flatten -> Linear(64, 32) -> ReLU -> Linear(32, 10); input "image" [1, 1, 8, 8]
  digits_tcnn.pt2  Conv(1->4, 3x3) -> BN -> ReLU -> MaxPool(2) -> Flatten -> Linear(64, 10)
Use them with examples/digits/calib.npz and eval.npz (same input name and shape).
    python examples/digits_fpga/train.py      # ~10 s on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "digits"))
from train import load_split  # noqa: E402  (the digits example's split: same calib/eval files)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64, 10),
    )


class Named(nn.Module):
    """Gives the exported input the name "image" (as in the digits example)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.body(image)


def train(model: nn.Module, epochs: int = 60) -> float:
    x_tr, x_te, y_tr, y_te = load_split()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_tr), torch.from_numpy(y_tr)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(torch.from_numpy(x_te)).argmax(1).numpy() == y_te).mean())


def main() -> None:
    torch.manual_seed(0)
    for name, body in (("digits_mlp", mlp()), ("digits_tcnn", tiny_cnn())):
        model = Named(body)
        acc = train(model)
        ep = torch.export.export(model, (torch.zeros(1, 1, 8, 8),))
        torch.export.save(ep, HERE / f"{name}.pt2")
        print(f"{name}: test accuracy {acc:.4f}; wrote {HERE / (name + '.pt2')}")


if __name__ == "__main__":
    main()
