"""Modules the zoo rebuilds around published weights (a state_dict is not a model: its code is the package's)."""

from __future__ import annotations


def resemblyzer_encoder():
    """Resemblyzer 0.1.4's VoiceEncoder (resemblyzer/voice_encoder.py): LSTM(40 -> 256, 3 layers), Linear(256,
    256), ReLU, L2 norm, with the wheel's pretrained.pt loaded weights-only (no code from the file runs)."""
    import torch

    from edgekit.zoo import fetch, select

    class VoiceEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(40, 256, 3, batch_first=True)
            self.linear = torch.nn.Linear(256, 256)
            self.relu = torch.nn.ReLU()

        def forward(self, mels):
            _, (hidden, _) = self.lstm(mels)
            raw = self.relu(self.linear(hidden[-1]))
            return raw / torch.norm(raw, dim=1, keepdim=True)

    path = fetch(select(["resemblyzer"])[0])
    state = torch.load(path, map_location="cpu", weights_only=True)["model_state"]
    net = VoiceEncoder()
    net.load_state_dict({k: v for k, v in state.items() if not k.startswith("similarity_")})
    return net.eval()
