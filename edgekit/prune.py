"""Structured channel pruning with torch-pruning (dependency-aware: residual adds, concats,
depthwise groups), then a short label-free fine-tune (distillation from the unpruned model
on the calibration inputs) to win accuracy back.

Needs the model as an ``nn.Module`` (a ``pkg.module:factory`` or a pickled module): a
torch.export program or TorchScript has no module structure left to prune.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import ModelLoadError


PRUNABLE_KINDS = ("factory", "pickle")  # ingest kinds that keep the nn.Module structure


def can_prune(model) -> bool:
    """Whether :func:`prune` can rebuild ``model``: an ``nn.Module`` (``pkg.module:factory`` or a pickled
    module) with Conv2d / Linear layers. A ``.pt2``, TorchScript, ONNX or Keras model cannot be pruned."""
    if model.kind not in PRUNABLE_KINDS or model.torch_module is None:
        return False
    torch = require("torch")
    return any(isinstance(m, torch.nn.Conv2d | torch.nn.Linear) for m in model.torch_module.modules())


def _module(model) -> Any:
    if not can_prune(model):
        raise ModelLoadError(
            f"{model.source}: structured pruning needs the model as an nn.Module (give pkg.module:factory); "
            f"a {model.kind} has no layer structure left to prune"
        )
    return model.torch_module


def prune(model, ratio: float, calib=None, steps: int = 150, lr: float = 1e-3, seed: int = 0) -> tuple[Any, dict]:
    """Prune ``ratio`` of the channels of every Conv/Linear but the output layer; fine-tune; return (module, info)."""
    torch = require("torch")
    tp = require("torch_pruning", "plan")
    teacher = _module(model).eval()
    student = copy.deepcopy(teacher)
    g = torch.Generator().manual_seed(seed)
    if calib is not None:
        xs = [torch.from_numpy(np.ascontiguousarray(calib.inputs[s.name])) for s in model.inputs]
        source = calib.source
    else:
        xs = [torch.rand((64, *s.shape[1:]), generator=g) for s in model.inputs]
        source = "random"
    example = tuple(x[:1] for x in xs)
    layers = [m for m in student.modules() if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    macs0, params0 = tp.utils.count_ops_and_params(student, example)
    pruner = tp.pruner.BasePruner(student, example, importance=tp.importance.GroupMagnitudeImportance(p=2),
                                  pruning_ratio=ratio, ignored_layers=[layers[-1]])
    pruner.step()
    macs1, params1 = tp.utils.count_ops_and_params(student, example)

    def loss_on(batch) -> Any:
        with torch.no_grad():
            target = teacher(*batch)
        return torch.nn.functional.mse_loss(student(*batch), target)

    n = len(xs[0])
    student.eval()
    with torch.no_grad():
        before = float(loss_on(tuple(x[: min(n, 256)] for x in xs)))
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    student.train()
    for _ in range(steps):
        idx = torch.randint(0, n, (min(32, n),), generator=g)
        opt.zero_grad()
        loss = loss_on(tuple(x[idx] for x in xs))
        loss.backward()
        opt.step()
    student.eval()
    with torch.no_grad():
        after = float(loss_on(tuple(x[: min(n, 256)] for x in xs)))
    info = {"tool": "torch-pruning", "version": tp.__version__ if hasattr(tp, "__version__") else None,
            "method": "group L2 magnitude, channel pruning", "ratio": ratio,
            "macs_before": int(macs0), "macs_after": int(macs1), "params_before": int(params0),
            "params_after": int(params1),
            "finetune": {"kind": "distillation from the unpruned model (MSE on outputs)", "steps": steps, "lr": lr,
                         "data": source, "loss_before": before, "loss_after": after}}
    return student, info


def save_exported(module, model, dest: Path) -> Path:
    """Save the pruned module as a torch.export ``.pt2`` (with the original input names) for the pipeline."""
    torch = require("torch")
    feeds = model.example_feeds()
    args = tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs)
    ep = torch.export.export(module.eval(), args)
    torch.export.save(ep, str(dest))
    return dest
