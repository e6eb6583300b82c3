"""The training run: options checked, the data and the student prepared, the optimizer, the loop (one process or
many), the held-out measure, and the fine-tuned model written with its record."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.data import Dataset
from edgekit.deps import require
from edgekit.errors import InputSpecError
from edgekit.fakequant import TARGETS, capture, set_mode, uncapture
from edgekit.finetune.checkpoint import check_out, check_resume, load_checkpoint, restore, save_checkpoint, write_model
from edgekit.finetune.data import output_kinds, prepare, tensors
from edgekit.finetune.launch import Launch, barrier, ddp, dist_setup, mean_over_ranks, teardown
from edgekit.finetune.losses import CLASS_LOSSES, Distill, loss_text
from edgekit.finetune.result import FinetuneResult, make_record
from edgekit.finetune.student import build_student
from edgekit.ingest import Model
from edgekit.lineage import sample_digests


def finetune(
    model: str | Path | Model,
    data: str | Path | Dataset | np.ndarray,
    out: str | Path,
    target: str = "jetson",
    epochs: int = 10,
    batch_size: int = 32,
    lr: float = 1e-4,
    temperature: float = 4.0,
    class_loss: str = "kl",
    feature_weight: float = 0.0,
    learn_ranges: bool = False,
    prune: float = 0.0,
    amp: bool = False,
    checkpoint_every: int = 0,
    checkpoint_dir: str | Path | None = None,
    resume: str | Path | None = None,
    seed: int = 0,
    holdout: float = 0.0,
    device: str | None = None,
    input_shape: list[str] | None = None,
    trust_pickle: bool = False,
    max_data_mb: float | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> FinetuneResult:
    """Distill the float ``model`` into an INT8 fake-quant student on unlabeled ``data`` and write the learned
    float weights to ``out`` (a ``.pt2`` that ``edgekit convert`` takes). Under ``torchrun`` each process takes
    ``batch_size / world_size`` samples of every global batch; only rank 0 writes.

    ``prune`` (a share of channels, for ``pkg.module:factory`` / pickled modules) makes the student a channel-pruned
    copy (torch-pruning, as the planner prunes) and distills the whole float model into it.
    ``class_loss``: ``kl`` (at ``temperature``) or ``mse`` on the probabilities (see ``losses.distill_loss``).
    ``learn_ranges``: the activation scales start at the min/max ranges and are trained with the weights (LSQ,
    learned step size); the record holds the learned ranges, which jetson's ``student_ranges=on`` imposes.
    ``holdout`` (a share of the data) is kept out of training: the student's agreement with the float model on
    those samples, before and after, shows whether training generalises or fits its samples.
    ``checkpoint_every`` N steps (and at the end) a checkpoint goes to ``checkpoint_dir`` (default
    ``<out>.ckpt/``); ``resume`` continues one exactly (weights, optimizer, schedule, step, RNG)."""
    torch = require("torch")
    from edgekit.ingest import load_model

    # every option is checked before any work
    _check_options(target, epochs, batch_size, checkpoint_every, lr, temperature, feature_weight, class_loss, device,
                   holdout, prune)
    out = Path(os.path.abspath(out))
    if out.suffix != ".pt2":
        raise InputSpecError(f"-o {out}: the fine-tuned model is a torch.export program; name it *.pt2")
    check_out(out)
    ckpt_dir = Path(os.path.abspath(checkpoint_dir)) if checkpoint_dir else out.with_name(out.name + ".ckpt")
    state = load_checkpoint(Path(resume)) if resume is not None else None

    run = dist_setup(device)
    world, dev = run.world, run.device
    if batch_size % world:
        raise InputSpecError(f"--batch-size {batch_size} is the global batch; it must split evenly over the "
                             f"{world} processes (give a multiple of {world})")
    try:
        # the data
        m = model if isinstance(model, Model) else load_model(model, input_shape, trust_pickle)
        rd = prepare(m, data, max_data_mb, holdout, seed)
        ds, n = rd.train, len(rd.train)
        steps_per_epoch = (n // world) // (batch_size // world)
        if steps_per_epoch == 0:
            raise InputSpecError(f"--data {ds.source}: {n} samples are fewer than one batch of {batch_size}; "
                                 "give more inputs or a smaller --batch-size")
        total = steps_per_epoch * epochs
        output_kinds(m, rd)
        recipe = {"target": target, "epochs": epochs, "batch_size": batch_size, "lr": lr,
                  "temperature": temperature, "feature_weight": feature_weight, "prune": prune, "amp": bool(amp),
                  "seed": seed, "data": ds.source, "samples": n, "data_sha256": rd.digest,
                  **({"holdout": holdout} if holdout else {}),  # absent at 0: older checkpoints resume
                  **({"learn_ranges": True} if learn_ranges else {}),
                  **({"class_loss": class_loss} if class_loss != "kl" else {}),
                  "model_sha256": m.sha256}
        if state is not None:
            check_resume(state, recipe, Path(resume))

        # the student
        torch.manual_seed(seed)
        xs = tensors(ds, m)
        built = build_student(m, ds, xs, target, prune, learn_ranges, dev, log)
        student, teacher = built.student, built.teacher

        # the optimizer
        opt = _optimizer(student, lr, total, amp, dev)
        step = 0
        if state is not None:
            step = restore(state, student, opt.opt, opt.sched, opt.scaler)
            log(f"resumed {resume} at step {step} of {total}")
        train = ddp(student, run)

        # the loop
        distill = Distill(rd.kinds, temperature, feature_weight, class_loss)
        before = distill.measure(student, teacher, xs, dev)
        held_xs = tensors(rd.held, m) if rd.held is not None else None
        held_before = distill.measure(student, teacher, held_xs, dev) if held_xs is not None else None
        loop = _Loop(student, train, teacher, xs, distill, opt, run, seed, batch_size // world, steps_per_epoch,
                     total, recipe, ckpt_dir, checkpoint_every, on_step)
        checkpoints, trained, seconds = loop.run(step)
        after = distill.measure(student, teacher, xs, dev)

        # the held-out samples
        held = _held_out(distill, student, teacher, held_xs, dev, held_before) if held_xs is not None else None

        # the record and the written model
        probs = [s.name for s, k in zip(m.outputs, rd.kinds, strict=True) if k == "class-probabilities"]
        record = make_record(m, sample_digests(ds, m), {
            **recipe, "steps": total, "world_size": world, "amp": opt.amp_kind, "output_kinds": rd.kinds_by_name,
            "loss": loss_text(class_loss, temperature, feature_weight, probs)}, student, built, before, after, held)
        written = write_model(student.net, m, out, record) if run.rank == 0 else None
        barrier(run)
        return FinetuneResult(written, total, epochs, world, opt.amp_kind, before[0], after[0], before[1], after[1],
                              seconds, seconds * steps_per_epoch / trained if trained else 0.0, checkpoints, record,
                              held)
    finally:
        teardown(run)


def _check_options(target: str, epochs: int, batch_size: int, checkpoint_every: int, lr: float, temperature: float,
                   feature_weight: float, class_loss: str, device: str | None, holdout: float, prune: float) -> None:
    if target not in TARGETS:
        raise InputSpecError(f"--target {target}: finetune models the INT8 of {', '.join(TARGETS)} (per-channel "
                             "int8 weights, per-tensor int8 activations); choose one of them")
    for name, v, lo in (("--epochs", epochs, 1), ("--batch-size", batch_size, 1),
                        ("--checkpoint-every", checkpoint_every, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputSpecError(f"{name} {v}: give an integer of at least {lo}")
    if not lr > 0 or not temperature > 0 or feature_weight < 0:
        raise InputSpecError("--lr and --temperature must be positive, --feature-weight zero or more")
    if class_loss not in CLASS_LOSSES:
        raise InputSpecError(f"--class-loss {class_loss}: choose kl (KL at --temperature) or mse (the squared "
                             "difference of the probabilities, which weighs the near ties)")
    if device not in (None, "auto", "cpu", "cuda"):
        raise InputSpecError(f"--device {device}: choose auto, cpu or cuda (under torchrun each process takes the "
                             "GPU of its LOCAL_RANK)")
    if isinstance(holdout, bool) or not 0 <= holdout < 1:
        raise InputSpecError(f"--holdout {holdout}: give the share of the data to keep out of training, from 0 up "
                             "to (not) 1")
    if not 0 <= prune < 1:
        raise InputSpecError(f"--prune {prune}: give the share of channels to remove, from 0 up to (not) 1")
    if prune and feature_weight:
        raise InputSpecError("--feature-weight compares the student's activations with the teacher's, point by "
                             "point; a pruned student has other channels: use one or the other")


def _held_out(distill: Distill, student, teacher, held_xs, dev, before: tuple[float, float | None]) -> dict[str, Any]:
    """The student on the samples kept out of training, after it trained (``before``: as it started), and its float
    weights alone there: what a float build of the output computes."""
    after = distill.measure(student, teacher, held_xs, dev)
    set_mode(student, "off")
    float_after = distill.measure(student, teacher, held_xs, dev)
    set_mode(student, "quant")
    return {"samples": len(held_xs[0]), "loss_before": before[0], "loss_after": after[0],
            "agreement_before": before[1], "agreement_after": after[1], "float_weights_agreement_after": float_after[1]}


@dataclass
class _Optimizer:
    opt: Any  # Adam over the trainable parameters
    sched: Any  # cosine to 0 over all the steps
    scaler: Any  # the fp16 grad scaler (a no-op without fp16)
    amp_kind: str | None  # "bf16" | "fp16" | None
    amp_dtype: Any


def _optimizer(student, lr: float, total: int, amp: bool, dev) -> _Optimizer:
    torch = require("torch")
    amp_kind = ("fp16" if dev.type == "cuda" else "bf16") if amp else None
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp_kind)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_kind == "fp16")
    opt = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    return _Optimizer(opt, sched, scaler, amp_kind, amp_dtype)


@dataclass
class _Loop:
    student: Any
    train: Any  # the module a step calls: the student, or DistributedDataParallel of it
    teacher: Any
    xs: list[Any]
    distill: Distill
    opt: _Optimizer
    ranks: Launch
    seed: int
    per_rank: int  # samples per process and step
    steps_per_epoch: int
    total: int
    recipe: dict[str, Any]
    ckpt_dir: Path
    checkpoint_every: int
    on_step: Callable[[int, int, float], None] | None

    def run(self, step: int) -> tuple[list[Path], int, float]:
        """Train from ``step`` to the end (each epoch's order from the seed, so a resumed run skips what was
        done); returns the checkpoints written, the steps trained here and their seconds."""
        torch = require("torch")
        run, dev, o = self.ranks, self.ranks.device, self.opt
        index = torch.utils.data.TensorDataset(torch.arange(len(self.xs[0])))
        sampler = torch.utils.data.distributed.DistributedSampler(index, num_replicas=run.world, rank=run.rank,
                                                                  shuffle=True, seed=self.seed, drop_last=True)
        checkpoints: list[Path] = []
        t0 = time.perf_counter()
        trained = 0
        feats = self.distill.feats
        while step < self.total:
            epoch, skip = divmod(step, self.steps_per_epoch)
            sampler.set_epoch(epoch)
            order = torch.tensor(list(iter(sampler)))
            for k in range(skip, self.steps_per_epoch):
                idx = order[k * self.per_rank:(k + 1) * self.per_rank]
                b = [x[idx].to(dev) for x in self.xs]
                s_f, t_f = capture(self.student, feats), capture(self.teacher, feats)
                with torch.no_grad():
                    to = self.teacher(*b)
                with torch.autocast(dev.type, dtype=o.amp_dtype, enabled=o.amp_dtype is not None):
                    so = self.train(*b)
                    loss = self.distill.loss(so, to, s_f, t_f)
                uncapture(self.student), uncapture(self.teacher)
                o.opt.zero_grad(set_to_none=True)
                o.scaler.scale(loss).backward()
                o.scaler.step(o.opt)
                o.scaler.update()
                o.sched.step()
                step += 1
                trained += 1
                shown = mean_over_ranks(loss.detach().float(), run)
                if run.rank == 0 and self.on_step is not None:
                    self.on_step(step, self.total, float(shown))
                if run.rank == 0 and ((self.checkpoint_every and step % self.checkpoint_every == 0)
                                      or step == self.total):
                    checkpoints.append(save_checkpoint(self.ckpt_dir, step, self.student, o.opt, o.sched, o.scaler,
                                                       self.recipe))
        return checkpoints, trained, time.perf_counter() - t0
