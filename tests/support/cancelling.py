"""A jetson INT8 case whose weights' rounding costs the output while each layer rounds well locally: used by
the layer-search tests (tests/test_mixed_precision.py) and the simulated-graph tests (tests/test_tensorrt_simulate.py)."""

from __future__ import annotations


def cancelling_pt2(path):
    """conv1 writes a feature twice, the copy with a few weights moved by 1% of the largest (which fixes each
    channel's int8 scale, so both get the same), and a small third channel; conv2 (weights 1, -1 and 2/127: exact
    in int8) takes the copies' difference, a small signal, plus the small channel. Rounding conv1's input moves
    both copies alike and cancels; rounding its weights does not: the moved weights round differently, by as much
    as they moved. Locally conv1 rounds well (its output is large); only the output shows what its weights cost."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(0)
    conv1, conv2 = torch.nn.Conv2d(1, 3, 3, padding=1, bias=False), torch.nn.Conv2d(3, 1, 1, bias=False)
    with torch.no_grad():
        w = torch.rand(1, 1, 3, 3, generator=g) + 0.5
        moved = torch.randn(1, 1, 3, 3, generator=g) * 0.01 * w.max()
        moved.view(-1)[w.view(-1).argmax()] = 0.0  # the largest weight stays: the same scale for both copies
        conv1.weight.copy_(torch.cat([w, w + moved, torch.rand(1, 1, 3, 3, generator=g) * 0.05]))
        conv2.weight.copy_(torch.tensor([1.0, -1.0, 2 / 127]).reshape(1, 3, 1, 1))
    model = torch.nn.Sequential(conv1, conv2).eval()
    x = np.random.default_rng(0).uniform(0.2, 1.0, (64, 1, 12, 12)).astype(np.float32)
    torch.export.save(torch.export.export(model, (torch.from_numpy(x[:1]),)), str(path))
    np.savez(path.with_name("calib.npz"), x=x)
    return x
