"""The student and its teacher: the float model's graph with batch norms folded and the target's fake
quantization inserted, its activation ranges measured once over the data and then held (or learned); the teacher
is the same graph with fake quantization off, or the whole float model where the student is a pruned copy."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgekit.deps import require
from edgekit.errors import InputSpecError
from edgekit.fakequant import SYMMETRIC_ACTS, act_fqs, fold_batch_norms, graph_module, insert_fake_quant, set_mode
from edgekit.finetune.batching import batch_chunk, chunked, free_batch
from edgekit.ingest import Model


@dataclass
class Student:
    student: Any  # the fake-quant graph (batching.chunked), on the training device, quantizing
    teacher: Any  # the float graph, frozen, on the training device
    weight_layers: int
    activation_points: int
    batch_norms_folded: int
    pruning: dict[str, Any] | None  # what --prune removed, as edgekit.prune reports it


def _graph(m: Model, prune: float, ds, log: Callable[[str], None]):
    """The student's graph: the model's, or (``prune``) a channel-pruned copy's (torch-pruning, as the planner
    prunes); with what the pruning did."""
    if not prune:
        return graph_module(m), None
    torch = require("torch")
    from edgekit.prune import prune as prune_channels

    pruned, pruning = prune_channels(m, prune, ds, steps=0)
    pruning.pop("finetune", None)
    feeds = m.example_feeds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ep = torch.export.export(pruned.eval(), tuple(torch.from_numpy(feeds[s.name]) for s in m.inputs))
    log(f"pruned {prune:.0%} of the channels: MACs {pruning['macs_before']:,} -> {pruning['macs_after']:,}")
    return graph_module(dataclasses.replace(m, exported=ep)), pruning


def _batching(gm, m: Model, xs, log: Callable[[str], None]):
    """(graph, chunk): chunk None where the graph takes any batch (folding and fake quant keep that); a graph
    traced at batch 1 whose reshapes can follow the batch is rewritten so, else it runs one sample at a time."""
    chunk = batch_chunk(gm, xs)
    if chunk is None:
        return gm, None
    if m.inputs[0].shape[0] != 1:
        raise InputSpecError(
            f"{m.source}: the graph is fixed at batch {m.inputs[0].shape[0]} (a reshape to it); finetune "
            "runs such a graph one sample at a time: export the model at batch 1 or with a dynamic batch")
    freed = copy.deepcopy(gm)
    n_free = free_batch(freed)
    if n_free and batch_chunk(freed, xs) is None:
        log(f"the graph was traced at batch 1: {n_free} reshape(s) to it now follow the batch (whole batches "
            "checked against one sample at a time)")
        return freed, None
    log("the graph is fixed at batch 1: each batch runs one sample at a time")
    return gm, chunk


def build_student(m: Model, ds, xs, target: str, prune: float, learn_ranges: bool, dev,
                  log: Callable[[str], None]) -> Student:
    """The fake-quant student of ``target``'s INT8 and its float teacher, for the samples ``ds`` (tensors ``xs``)."""
    torch = require("torch")
    gm, pruning = _graph(m, prune, ds, log)
    gm, chunk = _batching(gm, m, xs, log)
    folded = fold_batch_norms(gm)
    n_w, n_a = insert_fake_quant(gm, SYMMETRIC_ACTS[target], inputs_only=target == "jetson")
    # activation ranges: min/max of the float model over all the data, on every rank alike, then held
    set_mode(gm, "observe")
    with torch.no_grad():
        for i in range(0, len(xs[0]), 64):
            chunked(gm, chunk)(*(x[i:i + 64] for x in xs))
    for a in act_fqs(gm):
        a.freeze(learn=learn_ranges)
    if prune:
        teacher_gm = graph_module(m)
        teacher = chunked(teacher_gm, 1 if batch_chunk(teacher_gm, xs) else None).to(dev).eval()
    else:  # the same graph with fake quantization off: its activations line up with the student's
        teacher = chunked(copy.deepcopy(gm), chunk).to(dev).eval()
    set_mode(teacher, "off")
    for p in teacher.parameters():
        p.requires_grad_(False)
    set_mode(gm, "quant")
    return Student(chunked(gm, chunk).to(dev), teacher, n_w, n_a, folded, pruning)
