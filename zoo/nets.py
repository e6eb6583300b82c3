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


def minilm_program(cache) -> "Path":
    """all-MiniLM-L6-v2 (sentence-transformers; BERT, 6 layers, 384 wide, 12 heads, GELU, LayerNorm), rebuilt from
    the wheel's model.safetensors (plain tensors, no code) with its mean pooling and L2 normalisation, exported with
    torch.export for inputs ``input_ids`` and ``attention_mask`` [1, SEQ] int64 (the integer dtypes come with the
    program). Written once to ``<cache>/minilm-l6.pt2``."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    from edgekit.zoo import fetch, select

    dest = Path(cache) / "minilm-l6.pt2"
    if dest.is_file():
        return dest
    w = load_file(str(fetch(select(["minilm-l6"])[0])))
    H, heads, layers = 384, 12, 6

    def lin(prefix):
        m = torch.nn.Linear(*w[prefix + ".weight"].shape[::-1])
        m.load_state_dict({"weight": w[prefix + ".weight"], "bias": w[prefix + ".bias"]})
        return m

    def norm(prefix):
        m = torch.nn.LayerNorm(H, eps=1e-12)
        m.load_state_dict({"weight": w[prefix + ".weight"], "bias": w[prefix + ".bias"]})
        return m

    class Layer(torch.nn.Module):
        def __init__(self, p):
            super().__init__()
            self.q, self.k, self.v = (lin(f"{p}.attention.self.{n}") for n in ("query", "key", "value"))
            self.o, self.ln1 = lin(f"{p}.attention.output.dense"), norm(f"{p}.attention.output.LayerNorm")
            self.up, self.down = lin(f"{p}.intermediate.dense"), lin(f"{p}.output.dense")
            self.ln2 = norm(f"{p}.output.LayerNorm")

        def forward(self, x, bias):
            B, T, _ = x.shape
            q, k, v = (f(x).view(B, T, heads, H // heads).transpose(1, 2) for f in (self.q, self.k, self.v))
            att = torch.softmax(q @ k.transpose(-1, -2) / (H // heads) ** 0.5 + bias, dim=-1)
            x = self.ln1(x + self.o((att @ v).transpose(1, 2).reshape(B, T, H)))
            return self.ln2(x + self.down(torch.nn.functional.gelu(self.up(x))))

    class MiniLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.word = torch.nn.Embedding.from_pretrained(w["embeddings.word_embeddings.weight"])
            self.register_buffer("pos", w["embeddings.position_embeddings.weight"])
            self.register_buffer("typ", w["embeddings.token_type_embeddings.weight"][0])
            self.ln = norm("embeddings.LayerNorm")
            self.layers = torch.nn.ModuleList(Layer(f"encoder.layer.{i}") for i in range(layers))

        def forward(self, input_ids, attention_mask):
            T = input_ids.shape[1]
            x = self.ln(self.word(input_ids) + self.pos[:T] + self.typ)
            m = attention_mask.to(x.dtype)
            bias = ((1.0 - m) * -10000.0)[:, None, None, :]
            for layer in self.layers:
                x = layer(x, bias)
            pooled = (x * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1e-9)
            return pooled / pooled.norm(dim=1, keepdim=True).clamp_min(1e-12)

    from edgekit.zoo.data import MINILM_SEQ

    net = MiniLM().eval()
    ids = torch.zeros(1, MINILM_SEQ, dtype=torch.int64)
    ep = torch.export.export(net, (ids, torch.ones_like(ids)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.stem + ".part.pt2")
    torch.export.save(ep, str(tmp))
    tmp.replace(dest)
    return dest
