"""A model whose intermediate values exceed fp16's range (a power spectrum: |STFT|^2 of int16-scale audio, as
openWakeWord's melspectrogram computes) used to come out of an fp16 Core ML build as Inf/NaN. edgekit measures
each MIL op on the calibration inputs and keeps the ones that take or make such values in fp32."""

from __future__ import annotations

import numpy as np


def test_fp16_overflow_ops_stay_fp32(tmp_path):
    import torch

    from edgekit.pipeline import convert

    class Power(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.frame = torch.nn.Conv1d(1, 16, 64, stride=32, bias=False)  # a filter bank over raw samples
            torch.manual_seed(0)
            torch.nn.init.normal_(self.frame.weight, std=0.1)

        def forward(self, x):  # x: [1, 1024] int16-scale samples
            p = self.frame(x.unsqueeze(1)) ** 2  # up to ~1e8: beyond fp16's 65504
            return torch.log(p.mean(dim=1) + 1.0)

    net = Power().eval()
    p = tmp_path / "power.pt2"
    torch.export.save(torch.export.export(net, (torch.zeros(1, 1024),)), str(p))
    rng = np.random.default_rng(0)
    t = np.arange(1024) / 16000
    x = np.stack([8000 * np.sin(2 * np.pi * f * t) + 500 * rng.standard_normal(1024)
                  for f in rng.uniform(100, 4000, 96)]).astype(np.float32)
    np.savez(tmp_path / "audio.npz", x=x)
    res = convert(p, target="ios", precision="fp16", calib=str(tmp_path / "audio.npz"), golden_count=16,
                  out=tmp_path / "o", output_kinds={"output": "regression"}, fail_on_verification=False)
    kept = res.manifest["artifact"]["fp32_ops"]
    assert kept and max(kept.values()) > 65504, kept
    assert res.verification.passed, res.verification.failures
    assert any("computed in fp32 inside the fp16 program" in n for n in res.notes)
