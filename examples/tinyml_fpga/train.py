"""Train the MLPerf-Tiny-shaped models (nets.py) on the digits example's split and export them for the fabric.

Writes, next to this file (input "image" [1, 1, 8, 8], as in examples/digits):
  resnet8.pt2       ResNet-8 (image classification), 10 classes
  dscnn.pt2         DS-CNN (keyword spotting's shape), 10 classes
  autoencoder.pt2   the anomaly-detection autoencoder, reconstructing the 64 pixels
  ae_eval.npz       the held-out images without labels (the autoencoder's outputs are pixels, not classes)
Use them with examples/digits/calib.npz and examples/digits/eval.npz (ae_eval.npz for the autoencoder):
    python examples/tinyml_fpga/train.py      # ~2 min on 2 cores
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "digits"))
from nets import DSCNN, AutoEncoder, ResNet8  # noqa: E402
from train import load_split  # noqa: E402  (the digits example's split: same calib/eval files)


class Named(nn.Module):
    """Gives the exported input the name "image" (as in the digits example)."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, image):
        return self.body(image)


def fit(model: nn.Module, x, y, epochs: int, autoencoder: bool = False) -> nn.Module:
    torch.manual_seed(0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(xt))
        for i in range(0, len(xt), 64):
            b = perm[i:i + 64]
            out = model(xt[b])
            loss = (nn.functional.mse_loss(out, xt[b].flatten(1)) if autoencoder
                    else nn.functional.cross_entropy(out, yt[b]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def main() -> None:
    x_tr, x_te, y_tr, y_te = load_split()
    for name, net, epochs, ae in (("resnet8", ResNet8(), 12, False), ("dscnn", DSCNN(), 12, False),
                                  ("autoencoder", AutoEncoder(), 30, True)):
        model = Named(fit(net, x_tr, y_tr, epochs, ae)).eval()
        with torch.no_grad():
            out = model(torch.from_numpy(x_te))
        score = (f"mse {float(nn.functional.mse_loss(out, torch.from_numpy(x_te).flatten(1))):.4f}" if ae else
                 f"accuracy {float((out.argmax(1).numpy() == y_te).mean()):.2%}")
        torch.export.save(torch.export.export(model, (torch.zeros(1, 1, 8, 8),)), HERE / f"{name}.pt2")
        print(f"{name}.pt2: {sum(p.numel() for p in model.parameters())} parameters, held-out {score}")
    np.savez(HERE / "ae_eval.npz", image=x_te)


if __name__ == "__main__":
    main()
