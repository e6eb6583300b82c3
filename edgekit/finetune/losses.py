"""The distillation loss: the student's outputs against the float model's, by output kind, plus (optionally) the
quantized activations against the float ones; and the measure of a student on a set of samples (loss, top-1
agreement) that training reports before and after."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgekit.deps import require
from edgekit.fakequant import capture, uncapture

CLASS_LOSSES = ("kl", "mse")
PROB_FLOOR = 1e-12  # probabilities are floored here before their log (ln 1e-12 = -27.6)


def distill_loss(s_outs, t_outs, kinds: list[str], temperature: float, s_feats=None, t_feats=None,
                 feature_weight: float = 0.0, class_loss: str = "kl"):
    """``class_loss`` ``kl``: KL at ``temperature`` between the softened distributions (every row counts, the
    confident ones too); ``mse``: mean squared difference of the probabilities (softmax of logits, or the outputs
    themselves where a softmax ends the graph). Its gradient on a row's logits carries p(1 - p), so it spends the
    student on the near ties, where agreement is decided, and little on rows the model is sure of."""
    torch = require("torch")
    F = torch.nn.functional
    total = 0.0
    for s, t, kind in zip(s_outs, t_outs, kinds, strict=True):
        if kind in ("class", "class-probabilities"):  # one decision per row of the last axis ([N, C] or [N, T, C])
            s, t = s.float().reshape(-1, s.shape[-1]), t.float().reshape(-1, t.shape[-1])
            if class_loss == "mse":
                if kind == "class":
                    s, t = F.softmax(s, 1), F.softmax(t, 1)
                total = total + F.mse_loss(s, t)
                continue
            if kind == "class-probabilities":  # a softmax ends the graph: its logs are the logits (up to a constant)
                s, t = torch.log(s.clamp_min(PROB_FLOOR)), torch.log(t.clamp_min(PROB_FLOOR))
            T = temperature
            total = total + F.kl_div(F.log_softmax(s / T, 1), F.log_softmax(t / T, 1), reduction="batchmean",
                                     log_target=True) * T * T
        else:
            total = total + F.mse_loss(s.float().reshape(len(s), -1), t.float().reshape(len(t), -1))
    if feature_weight and s_feats:
        feat = sum(F.mse_loss(a.float(), b.float()) for a, b in zip(s_feats, t_feats, strict=True)) / len(s_feats)
        total = total + feature_weight * feat
    return total


def loss_kinds(kinds: list[str], ref: list[np.ndarray]) -> list[str]:
    """The kinds :func:`distill_loss` reads: a ``class`` output whose float values ``ref`` hold probabilities over
    its last axis (a softmax ends the graph; the check verify and the board use) is ``class-probabilities``, and the
    KL takes their logs (the logits behind them, up to a constant). Softmaxing the probabilities again (/T) would
    give near-uniform distributions whose KL is about half the probabilities' mean squared difference: a loss that
    ``--class-loss mse`` offers by name."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    out = []
    for kind, r in zip(kinds, ref, strict=True):
        r = np.asarray(r, dtype=np.float64)
        probs = kind == "class" and r.size > 0 and bool(smoke._probabilities(r.reshape(-1, r.shape[-1])))
        out.append("class-probabilities" if probs else kind)
    return out


def loss_text(class_loss: str, temperature: float, feature_weight: float, probability_outputs: list[str]) -> str:
    """The record's ``recipe.loss``: what was minimised, in words."""
    if class_loss == "mse":
        text = "MSE of the probabilities on class outputs"
    else:
        text = f"KL(T={temperature:g}) on class outputs"
        if probability_outputs:
            text += f" (on the logs of the probabilities of {', '.join(probability_outputs)})"
    return text + ", MSE on others" + (f", + {feature_weight:g} x feature MSE" if feature_weight else "")


@dataclass(frozen=True)
class Distill:
    """What one training run minimises: the loss kinds of the outputs and the loss's settings."""

    kinds: list[str]
    temperature: float
    feature_weight: float
    class_loss: str

    @property
    def feats(self) -> bool:
        """Whether the activations are compared too (they are captured only then)."""
        return self.feature_weight > 0

    def loss(self, s_outs, t_outs, s_feats=None, t_feats=None):
        return distill_loss(s_outs, t_outs, self.kinds, self.temperature, s_feats, t_feats, self.feature_weight,
                            self.class_loss)

    def measure(self, net, teacher, data, dev) -> tuple[float, float | None]:
        """Distillation loss over all the samples ``data`` (one tensor per input), and top-1 agreement of the first
        class output (per position where it is [N, T, C])."""
        torch = require("torch")
        total_loss, agree, count, rows = 0.0, 0, 0, 0
        ci = next((i for i, k in enumerate(self.kinds) if k.startswith("class")), None)
        with torch.no_grad():
            for i in range(0, len(data[0]), 64):
                b = [x[i:i + 64].to(dev) for x in data]
                s_f, t_f = capture(net, self.feats), capture(teacher, self.feats)
                so, to = net(*b), teacher(*b)
                uncapture(net), uncapture(teacher)
                total_loss += float(self.loss(so, to, s_f, t_f)) * len(b[0])
                if ci is not None:
                    s_c, t_c = (o[ci].reshape(-1, o[ci].shape[-1]) for o in (so, to))
                    agree += int((s_c.argmax(1) == t_c.argmax(1)).sum())
                    rows += len(s_c)
                count += len(b[0])
        return total_loss / count, (agree / rows if ci is not None else None)
