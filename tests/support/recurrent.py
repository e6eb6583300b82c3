"""A small recurrent model built here: two stacked GRU cells written out (Linear, sigmoid, tanh, so every target
runs them) over a chunk of frames, taking its state as ``state[2, B, 16]`` and handing the next state back as
``state_out`` (batch on axis 1, as a voice-activity model's LSTM state), and data from whole sequences: each chunk
takes the state the float model had after the chunk before it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYERS, HIDDEN, FRAMES, FEATURES = 2, 16, 4, 8


def build(folder: Path, chunks: int = 48, per_sequence: int = 12) -> dict[str, Path]:
    """``gru.onnx`` (dynamic batch: x on axis 0, state on axis 1), ``gru.pt2`` (static, batch 1) and
    ``chunks.npz`` (x [N, 4, 8], state [N, 2, 16]: samples first, the states of real sequences)."""
    import torch

    class Cell(torch.nn.Module):
        def __init__(self, i: int, h: int):
            super().__init__()
            self.x, self.h, self.n = torch.nn.Linear(i, 3 * h), torch.nn.Linear(h, 3 * h), h

        def forward(self, x, h):
            gx, gh, n = self.x(x), self.h(h), self.n
            r = torch.sigmoid(gx[:, :n] + gh[:, :n])
            z = torch.sigmoid(gx[:, n:2 * n] + gh[:, n:2 * n])
            c = torch.tanh(gx[:, 2 * n:] + r * gh[:, 2 * n:])
            return (1 - z) * c + z * h

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c0, self.c1 = Cell(FEATURES, HIDDEN), Cell(HIDDEN, HIDDEN)
            self.head = torch.nn.Linear(HIDDEN, 3)

        def forward(self, x, state):  # x [B, T, F], state [layers, B, H]
            h0, h1 = state[0], state[1]
            for t in range(x.shape[1]):
                h0 = self.c0(x[:, t], h0)
                h1 = self.c1(h0, h1)
            return self.head(h1), torch.stack([h0, h1])

    torch.manual_seed(0)
    net = Net().eval()
    example = (torch.zeros(1, FRAMES, FEATURES), torch.zeros(LAYERS, 1, HIDDEN))
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path, pt2_path, data = folder / "gru.onnx", folder / "gru.pt2", folder / "chunks.npz"
    torch.onnx.export(net, example, str(onnx_path), dynamo=False, opset_version=17,
                      input_names=["x", "state"], output_names=["logits", "state_out"],
                      dynamic_axes={"x": {0: "B"}, "state": {1: "B"}, "logits": {0: "B"}, "state_out": {1: "B"}})
    torch.export.save(torch.export.export(net, example), str(pt2_path))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((chunks, FRAMES, FEATURES)).astype(np.float32)
    states = np.zeros((chunks, LAYERS, HIDDEN), np.float32)
    h = torch.zeros(LAYERS, 1, HIDDEN)
    with torch.no_grad():
        for i in range(chunks):
            if i % per_sequence == 0:  # a new recording starts from silence
                h = torch.zeros(LAYERS, 1, HIDDEN)
            states[i] = h[:, 0].numpy()
            _, h = net(torch.from_numpy(x[i:i + 1]), h)
    np.savez(data, x=x, state=states)
    return {"onnx": onnx_path, "pt2": pt2_path, "data": data}
