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
    assert kept and any("beyond fp16's 65504" in why for why in kept.values()), kept
    assert res.verification.passed, res.verification.failures
    assert any("computed in fp32 inside the fp16 program" in n for n in res.notes)


def test_fp16_sensitive_ops_stay_fp32_only_those(tmp_path):
    """A softmax over a large vocabulary (a CTC recogniser's 6,625 characters) after large logits: rounded to fp16,
    the logits move the top probability by ~3%, beyond the 1% tolerance. edgekit measures the simulated fp16 program,
    keeps the few ops nearest that output in fp32 (never a wider tolerance), and the build verifies."""
    import torch

    from edgekit.pipeline import convert

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU())
            self.vocab = torch.nn.Linear(64, 6000)
            torch.nn.init.normal_(self.vocab.weight, std=0.6)
            torch.nn.init.constant_(self.vocab.bias, 100.0)  # logits near 100: fp16 steps of 0.06 there

        def forward(self, x):
            return torch.softmax(self.vocab(self.body(x)), dim=-1)

    p = tmp_path / "head.pt2"
    torch.export.save(torch.export.export(Head().eval(), (torch.zeros(1, 32),)), str(p))
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).standard_normal((48, 32)).astype(np.float32))
    # the probabilities' max error decides (the class alone is kept by fp16 here: the user asks for the values)
    res = convert(p, target="ios", precision="fp16", calib=str(tmp_path / "x.npz"), golden_count=16,
                  out=tmp_path / "o", fail_on_verification=False, tolerance={"max_error_decides": True})
    kept = res.manifest["artifact"]["fp32_ops"]
    assert res.verification.passed, res.verification.failures
    assert 1 <= len(kept) <= 3 and any("softmax" in why for why in kept.values()), kept
    assert res.manifest["artifact"]["linux_checks"]["op_counts"].get("cast", 0) >= 1  # fp16 elsewhere, casts between


def test_fp16_error_made_at_the_input_is_found_from_the_input_side(tmp_path):
    """Readings near 1000 with the signal in their last decimals (a sensor offset): rounded to fp16 (steps of 0.5
    there) the signal is gone before the first layer, and 40 layers lie between it and the output, more than the
    output-side search may keep. edgekit finds it from the input side: the first op stays fp32, the rest fp16."""
    import torch

    from edgekit.pipeline import convert

    class Deep(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            layers = []
            for _ in range(40):  # near-identity layers: the input's signal reaches the output
                lin = torch.nn.Linear(16, 16)
                torch.nn.init.eye_(lin.weight)
                lin.weight.data += 0.05 * torch.randn(16, 16)
                torch.nn.init.zeros_(lin.bias)
                layers += [lin, torch.nn.ReLU()]
            self.body = torch.nn.Sequential(*layers)
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.head(self.body((x - 1000.0) * 4.0))

    p = tmp_path / "deep.pt2"
    torch.export.save(torch.export.export(Deep().eval(), (torch.zeros(1, 16),)), str(p))
    x = 1000.0 + np.random.default_rng(0).uniform(-1, 1, (48, 16))
    np.savez(tmp_path / "x.npz", x=x.astype(np.float32))
    res = convert(p, target="ios", precision="fp16", calib=str(tmp_path / "x.npz"), golden_count=16,
                  out=tmp_path / "o", output_kinds={"output": "regression"}, fail_on_verification=False)
    kept = res.manifest["artifact"]["fp32_ops"]
    assert res.verification.passed, res.verification.failures
    assert kept and all("from an input" in why for why in kept.values()), kept
    assert len(kept) <= 4, kept  # the front only: the 40 layers stay fp16
