"""``edgekit finetune``: label-free distillation with INT8 quantization in the loop.

Teacher: the float model. Student: a copy of its graph with batch norms folded into the convolutions
(as the target's converter folds them) and fake quantization where the target quantizes: per-channel
symmetric int8 weights of every convolution and linear layer, per-tensor int8 activations at the graph
inputs and after every compute op (a ReLU or batch norm that follows is fused into the op before it).
Activation ranges are min/max over the data, measured once on the float model and then held; weights
learn around them with a straight-through estimator. The loss is distillation on the outputs (KL at a
temperature for ``class`` outputs, MSE for the others; the kinds are inferred as verify infers them)
and, with ``feature_weight``, MSE on every quantized activation. No labels are read.

What flows back into ``convert``: the learned float weights (batch norms folded), saved as a ``.pt2``
that convert quantizes again from ``--calib``. Weight scales follow from the weights (per-channel
max |w| / 127, what the targets compute). The activation ranges used in training are recorded in the
file's ``edgekit-finetune.json`` (with the recipe and ``finetuned_from``); a jetson convert with
``--option student_ranges=on`` imposes them on the tensors that hold the same values (:func:`student_ranges`),
so the Q/DQ build computes what the student trained as; otherwise, and on android, convert recalibrates.

Runs on one process or under ``torchrun`` (DistributedDataParallel, gloo on CPU, nccl on CUDA): the
global batch is split across the processes, so the same command trains the same model; only rank 0
writes checkpoints, the output and the progress.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.data import Dataset
from edgekit.deps import require
from edgekit.errors import InputSpecError, OutputError
from edgekit.fakequant import SYMMETRIC_ACTS, TARGETS  # noqa: F401
from edgekit.fakequant import act_fqs as _act_fqs
from edgekit.fakequant import capture as _capture
from edgekit.fakequant import fold_batch_norms as _fold_batch_norms
from edgekit.fakequant import graph_module as _graph_module
from edgekit.fakequant import insert_fake_quant as _insert_fake_quant
from edgekit.fakequant import set_mode as _set_mode
from edgekit.fakequant import uncapture as _uncapture
from edgekit.ingest import Model
from edgekit.lineage import RECORD, read_record, sample_digests, student_ranges  # noqa: F401
from edgekit.lineage import data_digest as _digest

CKPT_FORMAT = 1


@dataclass
class FinetuneResult:
    out: Path | None  # the fine-tuned .pt2 (None on ranks other than 0)
    steps: int
    epochs: int
    world_size: int
    amp: str | None  # "bf16" | "fp16" | None
    loss_before: float  # distillation loss of the fake-quant student on all the data, before training
    loss_after: float
    agreement_before: float | None  # top-1 agreement of the fake-quant student with the float model (class output)
    agreement_after: float | None
    seconds: float
    seconds_per_epoch: float
    checkpoints: list[Path] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    # --holdout: the samples kept out of training, and the student's agreement / loss on them before and after
    holdout: dict[str, Any] | None = None


# ---------------------------------------------------------------- fake quantization


# ---------------------------------------------------------------- loss and batches


def _chunked(student, chunk: int | None):
    """Run a batch through a graph exported at a fixed batch size, ``chunk`` samples at a time (one module,
    one forward: DistributedDataParallel sees one call per step)."""
    torch = require("torch")

    class Chunked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = student

        def forward(self, *xs):
            if chunk is None:
                return self.net(*xs)
            outs = [self.net(*(x[i:i + chunk] for x in xs)) for i in range(0, len(xs[0]), chunk)]
            return tuple(torch.cat([o[k] for o in outs]) for k in range(len(outs[0])))

    return Chunked()


def _batch_chunk(student, xs) -> int | None:
    """None when the graph takes any batch size (checked against sample-by-sample results), else the model's."""
    torch = require("torch")
    n = min(4, len(xs[0]))
    with torch.no_grad():
        try:
            whole = student(*(x[:n] for x in xs))
        except Exception:  # noqa: BLE001 - a graph with a fixed batch (a reshape to it) refuses other sizes
            return 1
        one = [student(*(x[i:i + 1] for x in xs)) for i in range(n)]
    for k, w in enumerate(whole):
        if w.shape[:1] != (n,) or not torch.allclose(w, torch.cat([o[k] for o in one]), rtol=1e-4, atol=1e-5):
            return 1
    return None


def _free_batch(gm) -> int:
    """Let a graph traced at batch 1 take any batch: a reshape from ``[1, ...]`` to ``[1, ...]`` with as many
    elements per sample (ppocr-cls's ``[1, 200, 1, 1] -> [1, 200]`` before its classifier, as onnxslim folded it
    at the fixed shape) is rewritten to ``[-1, ...]``. Other ops may still hold the batch; the caller keeps the
    rewrite only where ``_batch_chunk`` finds whole batches equal to one sample at a time. Returns how many."""
    torch = require("torch")
    aten = torch.ops.aten
    done = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in (aten.reshape.default, aten.view.default,
                                                       aten._unsafe_view.default):
            continue
        inp = getattr(n.args[0], "meta", {}).get("val")
        out = n.meta.get("val")
        if inp is None or out is None or not inp.ndim or not out.ndim:
            continue
        try:
            dims_in, dims_out = [int(d) for d in inp.shape], [int(d) for d in out.shape]
        except (TypeError, ValueError):  # a symbolic size: the graph already follows some size
            continue
        if dims_in[0] == 1 and dims_out[0] == 1 and int(np.prod(dims_in[1:])) == int(np.prod(dims_out[1:])):
            n.args = (n.args[0], [-1, *dims_out[1:]])
            done += 1
    if done:
        gm.recompile()
    return done


CLASS_LOSSES = ("kl", "mse")


def _loss(s_outs, t_outs, kinds: list[str], temperature: float, s_feats=None, t_feats=None,
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


PROB_FLOOR = 1e-12  # probabilities are floored here before their log (ln 1e-12 = -27.6)


def _loss_kinds(kinds: list[str], ref: list[np.ndarray]) -> list[str]:
    """The kinds ``_loss`` reads: a ``class`` output whose float values ``ref`` hold probabilities over its last
    axis (a softmax ends the graph; the check verify and the board use) is ``class-probabilities``, and the KL takes
    their logs (the logits behind them, up to a constant). Softmaxing the probabilities again (/T) would give
    near-uniform distributions whose KL is about half the probabilities' mean squared difference: a loss that
    ``--class-loss mse`` offers by name."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    out = []
    for kind, r in zip(kinds, ref, strict=True):
        r = np.asarray(r, dtype=np.float64)
        probs = kind == "class" and r.size > 0 and bool(smoke._probabilities(r.reshape(-1, r.shape[-1])))
        out.append("class-probabilities" if probs else kind)
    return out


def _loss_text(class_loss: str, temperature: float, feature_weight: float, probability_outputs: list[str]) -> str:
    """The record's ``recipe.loss``: what was minimised, in words."""
    if class_loss == "mse":
        text = "MSE of the probabilities on class outputs"
    else:
        text = f"KL(T={temperature:g}) on class outputs"
        if probability_outputs:
            text += f" (on the logs of the probabilities of {', '.join(probability_outputs)})"
    return text + ", MSE on others" + (f", + {feature_weight:g} x feature MSE" if feature_weight else "")


def _tensors(data: Dataset, model: Model):
    torch = require("torch")
    return [torch.from_numpy(np.ascontiguousarray(data.inputs[s.name])) for s in model.inputs]


def load_unlabeled(path: str | Path, model: Model, max_mb: float | None = None) -> Dataset:
    """Inputs to distill on: a ``.npz`` (as ``--calib``; labels are ignored) or a folder of ``.npy`` files
    (single-input models; each one sample or a stack of samples)."""
    from edgekit.data import _check_values, load_npz

    path = Path(path)
    if not path.is_dir():
        return load_npz(path, model, what="--data", max_mb=max_mb)
    files = sorted(path.glob("*.npy"))
    if not files:
        raise InputSpecError(f"--data {path}: no .npy files in the folder; give a .npz or a folder of .npy inputs")
    if len(model.inputs) != 1:
        raise InputSpecError(f"--data {path}: a folder of .npy files feeds one input; the model has "
                             f"{len(model.inputs)}: give a .npz with one array per input name")
    spec = model.inputs[0]
    sample = tuple(spec.shape[1:])
    arrays = []
    for f in files:
        try:
            a = np.load(f, allow_pickle=False)
        except ValueError as exc:
            raise InputSpecError(f"--data {f}: not a plain numpy array ({exc})") from None
        a = a[None] if tuple(a.shape) == sample else a
        if tuple(a.shape[1:]) != sample:
            raise InputSpecError(f"--data {f}: shape {list(a.shape)}; the model takes samples of shape {list(sample)}")
        _check_values(f"--data {f}", spec.name, a)
        arrays.append(a.astype(spec.dtype, copy=False))
    return Dataset(str(path), {spec.name: np.ascontiguousarray(np.concatenate(arrays))}, None, False)


# ---------------------------------------------------------------- distributed


def _dist_setup(device: str | None):
    """(rank, world, device, initialized_here) from torchrun's environment; one process when absent."""
    torch = require("torch")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() if device in (None, "auto") else device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise InputSpecError("--device cuda: torch sees no CUDA device here (a CPU build of torch, or no GPU); "
                             "use --device cpu")
    if world <= 1:
        return 0, 1, torch.device("cuda" if cuda else "cpu"), False
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    here = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        here = True
    return dist.get_rank(), dist.get_world_size(), dev, here


# ---------------------------------------------------------------- the API


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
    ``class_loss``: ``kl`` (at ``temperature``) or ``mse`` on the probabilities (see ``_loss``).
    ``learn_ranges``: the activation scales start at the min/max ranges and are trained with the weights (LSQ,
    learned step size); the record holds the learned ranges, which jetson's ``student_ranges=on`` imposes.
    ``holdout`` (a share of the data) is kept out of training: the student's agreement with the float model on
    those samples, before and after, shows whether training generalises or fits its samples.
    ``checkpoint_every`` N steps (and at the end) a checkpoint goes to ``checkpoint_dir`` (default
    ``<out>.ckpt/``); ``resume`` continues one exactly (weights, optimizer, schedule, step, RNG)."""
    torch = require("torch")
    from edgekit.ingest import load_model
    from edgekit.verify import infer_kinds, reference_outputs

    # every option is checked before any work
    if target not in TARGETS:
        raise InputSpecError(f"--target {target}: finetune models the INT8 of {', '.join(TARGETS)} (per-channel "
                             "int8 weights, per-tensor int8 activations); choose one of them")
    for name, v, lo in (("--epochs", epochs, 1), ("--batch-size", batch_size, 1), ("--checkpoint-every", checkpoint_every, 0)):
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
    out = Path(os.path.abspath(out))
    if out.suffix != ".pt2":
        raise InputSpecError(f"-o {out}: the fine-tuned model is a torch.export program; name it *.pt2")
    _check_out(out)
    ckpt_dir = Path(os.path.abspath(checkpoint_dir)) if checkpoint_dir else out.with_name(out.name + ".ckpt")
    state = None
    if resume is not None:
        state = _load_checkpoint(Path(resume))

    rank, world, dev, dist_here = _dist_setup(device)
    if batch_size % world:
        raise InputSpecError(f"--batch-size {batch_size} is the global batch; it must split evenly over the "
                             f"{world} processes (give a multiple of {world})")
    try:
        m = model if isinstance(model, Model) else load_model(model, input_shape, trust_pickle)
        if isinstance(data, np.ndarray):
            if len(m.inputs) != 1:
                raise InputSpecError("an array of inputs feeds a single-input model; give a Dataset or a .npz")
            data = Dataset("array", {m.inputs[0].name: np.ascontiguousarray(data, dtype=m.inputs[0].dtype)}, None)
        ds = data if isinstance(data, Dataset) else load_unlabeled(data, m, max_data_mb)
        digest = _digest(ds, m)  # of the whole file: a resume checks the same data
        held_ds = None
        if holdout:
            k = max(1, round(len(ds) * holdout))
            order = np.random.default_rng(seed).permutation(len(ds))
            held_ds, ds = ds.subset(np.sort(order[:k])), ds.subset(np.sort(order[k:]))
        n = len(ds)
        steps_per_epoch = (n // world) // (batch_size // world)
        if steps_per_epoch == 0:
            raise InputSpecError(f"--data {ds.source}: {n} samples are fewer than one batch of {batch_size}; "
                                 "give more inputs or a smaller --batch-size")
        total = steps_per_epoch * epochs
        ref = reference_outputs(m, m.reference(), ds)
        kinds_by_name = infer_kinds(m, m.reference(), ds, outputs=ref)
        kinds = _loss_kinds([kinds_by_name[s.name] for s in m.outputs], ref)
        del ref
        recipe = {"target": target, "epochs": epochs, "batch_size": batch_size, "lr": lr,
                  "temperature": temperature, "feature_weight": feature_weight, "prune": prune, "amp": bool(amp),
                  "seed": seed, "data": ds.source, "samples": n, "data_sha256": digest,
                  **({"holdout": holdout} if holdout else {}),  # absent at 0: older checkpoints resume
                  **({"learn_ranges": True} if learn_ranges else {}),
                  **({"class_loss": class_loss} if class_loss != "kl" else {}),
                  "model_sha256": m.sha256}
        if state is not None:
            _check_resume(state, recipe, Path(resume))

        torch.manual_seed(seed)
        xs = _tensors(ds, m)
        pruning = None
        if prune:  # the student is a channel-pruned copy (torch-pruning); the teacher stays the whole float model
            from edgekit.prune import prune as prune_channels

            pruned, pruning = prune_channels(m, prune, ds, steps=0)
            pruning.pop("finetune", None)
            feeds = m.example_feeds()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ep = torch.export.export(pruned.eval(), tuple(torch.from_numpy(feeds[s.name]) for s in m.inputs))
            gm = _graph_module(dataclasses.replace(m, exported=ep))
            log(f"pruned {prune:.0%} of the channels: MACs {pruning['macs_before']:,} -> {pruning['macs_after']:,}")
        else:
            gm = _graph_module(m)
        chunk = _batch_chunk(gm, xs)  # None: the graph takes any batch (folding and fake quant keep that)
        if chunk is not None:
            if m.inputs[0].shape[0] != 1:
                raise InputSpecError(
                    f"{m.source}: the graph is fixed at batch {m.inputs[0].shape[0]} (a reshape to it); finetune "
                    "runs such a graph one sample at a time: export the model at batch 1 or with a dynamic batch")
            freed = copy.deepcopy(gm)
            n_free = _free_batch(freed)
            if n_free and _batch_chunk(freed, xs) is None:
                gm, chunk = freed, None
                log(f"the graph was traced at batch 1: {n_free} reshape(s) to it now follow the batch (whole batches "
                    "checked against one sample at a time)")
            else:
                log("the graph is fixed at batch 1: each batch runs one sample at a time")
        folded = _fold_batch_norms(gm)
        n_w, n_a = _insert_fake_quant(gm, SYMMETRIC_ACTS[target], inputs_only=target == "jetson")
        # activation ranges: min/max of the float model over all the data, on every rank alike, then held
        _set_mode(gm, "observe")
        with torch.no_grad():
            for i in range(0, n, 64):
                _chunked(gm, chunk)(*(x[i:i + 64] for x in xs))
        for a in _act_fqs(gm):
            a.freeze(learn=learn_ranges)
        if prune:
            teacher_gm = _graph_module(m)
            teacher = _chunked(teacher_gm, 1 if _batch_chunk(teacher_gm, xs) else None).to(dev).eval()
        else:  # the same graph with fake quantization off: its activations line up with the student's
            teacher = _chunked(copy.deepcopy(gm), chunk).to(dev).eval()
        _set_mode(teacher, "off")
        for p in teacher.parameters():
            p.requires_grad_(False)
        _set_mode(gm, "quant")
        student = _chunked(gm, chunk).to(dev)

        amp_kind = ("fp16" if dev.type == "cuda" else "bf16") if amp else None
        amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp_kind)
        scaler = torch.amp.GradScaler("cuda", enabled=amp_kind == "fp16")
        opt = torch.optim.Adam([p for p in student.parameters() if p.requires_grad], lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        step = 0
        if state is not None:
            student.net.load_state_dict(state["student"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            torch.set_rng_state(state["rng_cpu"])
            step = int(state["step"])
            log(f"resumed {resume} at step {step} of {total}")
        train = student
        if world > 1:
            train = torch.nn.parallel.DistributedDataParallel(student, device_ids=[dev.index] if dev.type == "cuda" else None,
                                                              forward_sync_buffers=False)

        def losses(net, feats: bool, data=xs):
            """Distillation loss over all the (training, or ``data``) samples, and top-1 agreement of the first class
            output (per position where it is [N, T, C])."""
            total_loss, agree, count, rows = 0.0, 0, 0, 0
            ci = next((i for i, k in enumerate(kinds) if k.startswith("class")), None)
            with torch.no_grad():
                for i in range(0, len(data[0]), 64):
                    b = [x[i:i + 64].to(dev) for x in data]
                    s_f, t_f = _capture(net, feats), _capture(teacher, feats)
                    so, to = net(*b), teacher(*b)
                    _uncapture(net), _uncapture(teacher)
                    loss = _loss(so, to, kinds, temperature, s_f, t_f, feature_weight, class_loss)
                    total_loss += float(loss) * len(b[0])
                    if ci is not None:
                        s_c, t_c = (o[ci].reshape(-1, o[ci].shape[-1]) for o in (so, to))
                        agree += int((s_c.argmax(1) == t_c.argmax(1)).sum())
                        rows += len(s_c)
                    count += len(b[0])
            return total_loss / count, (agree / rows if ci is not None else None)

        loss_before, agree_before = losses(student, feature_weight > 0)
        held_xs = _tensors(held_ds, m) if held_ds is not None else None
        held_before = losses(student, feature_weight > 0, held_xs) if held_xs is not None else None
        index = torch.utils.data.TensorDataset(torch.arange(n))
        sampler = torch.utils.data.distributed.DistributedSampler(index, num_replicas=world, rank=rank, shuffle=True,
                                                                  seed=seed, drop_last=True)
        per_rank = batch_size // world
        checkpoints: list[Path] = []
        t0 = time.perf_counter()
        trained = 0
        while step < total:
            epoch, skip = divmod(step, steps_per_epoch)
            sampler.set_epoch(epoch)
            order = torch.tensor(list(iter(sampler)))
            for k in range(skip, steps_per_epoch):
                idx = order[k * per_rank:(k + 1) * per_rank]
                b = [x[idx].to(dev) for x in xs]
                s_f, t_f = _capture(student, feature_weight > 0), _capture(teacher, feature_weight > 0)
                with torch.no_grad():
                    to = teacher(*b)
                with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    so = train(*b)
                    loss = _loss(so, to, kinds, temperature, s_f, t_f, feature_weight, class_loss)
                _uncapture(student), _uncapture(teacher)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                sched.step()
                step += 1
                trained += 1
                shown = loss.detach().float()
                if world > 1:
                    torch.distributed.all_reduce(shown)
                    shown /= world
                if rank == 0 and on_step is not None:
                    on_step(step, total, float(shown))
                if rank == 0 and ((checkpoint_every and step % checkpoint_every == 0) or step == total):
                    checkpoints.append(_save_checkpoint(ckpt_dir, step, student, opt, sched, scaler, recipe))
        seconds = time.perf_counter() - t0
        loss_after, agree_after = losses(student, feature_weight > 0)
        held = None
        if held_xs is not None:
            held_after = losses(student, feature_weight > 0, held_xs)
            _set_mode(student, "off")  # the float weights alone: what a float build of the output computes
            float_after = losses(student, feature_weight > 0, held_xs)
            _set_mode(student, "quant")
            held = {"samples": len(held_ds), "loss_before": held_before[0], "loss_after": held_after[0],
                    "agreement_before": held_before[1], "agreement_after": held_after[1],
                    "float_weights_agreement_after": float_after[1]}
        origin = {"path": m.source, "sha256": m.sha256}
        if Path(m.source).is_file():  # convert finds it from another folder too, to measure against it
            origin["abspath"] = str(Path(m.source).resolve())
        record = {"finetuned_from": origin, "data_samples": sample_digests(ds, m),
                  "recipe": {**recipe, "steps": total, "world_size": world, "amp": amp_kind, "output_kinds": kinds_by_name,
                             "loss": _loss_text(class_loss, temperature, feature_weight, [
                                 s.name for s, k in zip(m.outputs, kinds) if k == "class-probabilities"])},
                  "student": {"weights": "int8 symmetric per-channel (fake-quant)", "weight_layers": n_w,
                              "pruned": pruning,
                              "activations": ("int8 per-tensor " + ("symmetric" if SYMMETRIC_ACTS[target] else "asymmetric")
                                              + (" at the inputs of conv/linear/matmul/average pooling (TensorRT's "
                                                 "Q/DQ placement)" if target == "jetson" else " after every compute op")
                                              + (", min/max over the data, then learned (LSQ)" if learn_ranges
                                                 else ", min/max over the data, held")),
                              "activation_points": n_a, "batch_norms_folded": folded},
                  "activation_ranges": [list(a.held_range()) for a in _act_fqs(student)],
                  "loss_before": loss_before, "loss_after": loss_after,
                  "agreement_before": agree_before, "agreement_after": agree_after, "holdout": held,
                  "flows_back": "learned float weights (batch norms folded), and on jetson these activation ranges "
                                "(convert --option student_ranges=on imposes them where the tensors match); the "
                                "weight scales follow from the weights"}
        written = None
        if rank == 0:
            written = _write_model(student.net, m, out, record)
        if world > 1:
            torch.distributed.barrier()
        return FinetuneResult(written, total, epochs, world, amp_kind, loss_before, loss_after, agree_before,
                              agree_after, seconds, seconds * steps_per_epoch / trained if trained else 0.0,
                              checkpoints, record, held)
    finally:
        if dist_here:
            torch.distributed.destroy_process_group()


def holdout_line(h: dict[str, Any]) -> str:
    """What the held-out samples say, in one line; a loss that rose there is called out."""
    agree = ("" if h["agreement_before"] is None else
             f"; top-1 agreement {h['agreement_before']:.1%} -> {h['agreement_after']:.1%} (INT8 fake-quant), "
             f"{h['float_weights_agreement_after']:.1%} (the fine-tuned float weights)")
    fell = h["agreement_before"] is not None and h["agreement_after"] < h["agreement_before"]
    what = ("worse" if h["loss_after"] > h["loss_before"] else
            "top-1 agreement fell (the loss did not rise)" if fell else "")
    # ppocr-cls on 3800 lines: the held-out loss fell 0.0075 -> 0.0054 while agreement fell 95.0% -> 93.5%
    worse = (f" -- {what} on samples it did not train on: it fits its training samples; give more data, fewer "
             "--epochs or a lower --lr" if what else "")
    return (f"held out {h['samples']} samples: distillation loss {h['loss_before']:.4g} -> {h['loss_after']:.4g}"
            f"{agree}{worse}")


# ---------------------------------------------------------------- files


def _check_out(out: Path) -> None:
    """``out`` may be written: it does not exist, or it is a .pt2 that finetune wrote (its record inside)."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_file() and not out.is_symlink() and zipfile.is_zipfile(out):
        with zipfile.ZipFile(out) as zf:
            if any(n.endswith("/extra/" + RECORD) or n == "extra/" + RECORD for n in zf.namelist()):
                return
    raise OutputError(f"{out} exists and is not a model edgekit finetune wrote; choose another -o")


def _write_model(net, model: Model, out: Path, record: dict[str, Any]) -> Path:
    """The student with fake quantization off, exported as a .pt2 with the recipe inside; written atomically."""
    torch = require("torch")
    import tempfile

    from edgekit.fsutil import file_mode

    feeds = model.example_feeds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        net = copy.deepcopy(net).cpu().eval()
        _set_mode(net, "off")
        for p in net.parameters():
            p.requires_grad_(False)
        ep = torch.export.export(net, tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs))
    out.parent.mkdir(parents=True, exist_ok=True)
    _check_out(out)  # again: something may have appeared there while it trained
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", suffix=".pt2", dir=out.parent)
    os.close(fd)
    try:
        torch.export.save(ep, tmp, extra_files={RECORD: json.dumps(record, indent=2)})
        os.chmod(tmp, file_mode())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _save_checkpoint(folder: Path, step: int, student, opt, sched, scaler, recipe: dict[str, Any]) -> Path:
    torch = require("torch")
    import io

    from edgekit.fsutil import atomic_write_bytes

    buf = io.BytesIO()
    torch.save({"format": CKPT_FORMAT, "step": step, "recipe": recipe, "student": student.net.state_dict(),
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
                "rng_cpu": torch.get_rng_state()}, buf)
    dest = folder / f"step-{step:07d}.pt"
    atomic_write_bytes(dest, buf.getvalue())
    return dest


def _load_checkpoint(path: Path) -> dict[str, Any]:
    torch = require("torch")
    if not path.is_file():
        raise InputSpecError(f"--resume {path}: no such checkpoint file")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)  # tensors and plain values only
    except Exception as exc:  # noqa: BLE001 - torch raises many types for damaged or foreign files
        raise InputSpecError(f"--resume {path}: not a finetune checkpoint ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    if not isinstance(state, dict) or state.get("format") != CKPT_FORMAT:
        raise InputSpecError(f"--resume {path}: not a checkpoint written by edgekit finetune")
    return state


def _check_resume(state: dict[str, Any], recipe: dict[str, Any], path: Path) -> None:
    diff = [f"{k} {state['recipe'].get(k)!r} -> {v!r}" for k, v in recipe.items()
            if state["recipe"].get(k) != v and k != "data"]  # the data by content: a path may be written otherwise
    if diff:
        raise InputSpecError(f"--resume {path}: the checkpoint was made with other settings ({'; '.join(diff)}); "
                             "resume with the same model, data and options")


def result_json(res: FinetuneResult) -> dict[str, Any]:
    d = asdict(res)
    d["out"] = str(res.out) if res.out else None
    d["checkpoints"] = [str(p) for p in res.checkpoints]
    return d

