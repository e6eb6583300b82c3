"""What a run gives back (:class:`FinetuneResult`) and what it writes into the fine-tuned model: the lineage
record (edgekit.lineage.RECORD) with its origin, recipe, student and the activation ranges convert may impose."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgekit.fakequant import SYMMETRIC_ACTS, act_fqs
from edgekit.ingest import Model


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


def result_json(res: FinetuneResult) -> dict[str, Any]:
    d = asdict(res)
    d["out"] = str(res.out) if res.out else None
    d["checkpoints"] = [str(p) for p in res.checkpoints]
    return d


def holdout_line(h: dict[str, Any]) -> str:
    """What the held-out samples say, in one line; a loss that rose there is called out."""
    agree = ("" if h["agreement_before"] is None else
             f"; top-1 agreement {h['agreement_before']:.1%} -> {h['agreement_after']:.1%} (INT8 fake-quant), "
             f"{h['float_weights_agreement_after']:.1%} (the fine-tuned float weights)")
    fell = h["agreement_before"] is not None and h["agreement_after"] < h["agreement_before"]
    # the loss can fall on held-out samples while the decisions there get worse: both are watched
    what = ("worse" if h["loss_after"] > h["loss_before"] else
            "top-1 agreement fell (the loss did not rise)" if fell else "")
    worse = (f" -- {what} on samples it did not train on: it fits its training samples; give more data, fewer "
             "--epochs or a lower --lr" if what else "")
    return (f"held out {h['samples']} samples: distillation loss {h['loss_before']:.4g} -> {h['loss_after']:.4g}"
            f"{agree}{worse}")


def student_text(target: str, learn_ranges: bool) -> str:
    """How the student quantizes its activations, in words."""
    return ("int8 per-tensor " + ("symmetric" if SYMMETRIC_ACTS[target] else "asymmetric")
            + (" at the inputs of conv/linear/matmul/average pooling (TensorRT's Q/DQ placement)" if target == "jetson"
               else " after every compute op")
            + (", min/max over the data, then learned (LSQ)" if learn_ranges else ", min/max over the data, held"))


def make_record(m: Model, samples: list[str], recipe: dict[str, Any], student, built, before, after,
                held: dict[str, Any] | None) -> dict[str, Any]:
    """The record the fine-tuned ``.pt2`` carries. ``samples``: the training samples' fingerprints
    (edgekit.lineage.sample_digests); ``recipe``: the run's settings with what it made of them (steps, world size,
    AMP, output kinds, the loss in words); ``built``: the student as built (student.Student); ``before`` /
    ``after``: (loss, agreement) on the training samples."""
    origin = {"path": m.source, "sha256": m.sha256}
    if Path(m.source).is_file():  # convert finds it from another folder too, to measure against it
        origin["abspath"] = str(Path(m.source).resolve())
    return {"finetuned_from": origin, "data_samples": samples, "recipe": recipe,
            "student": {"weights": "int8 symmetric per-channel (fake-quant)", "weight_layers": built.weight_layers,
                        "pruned": built.pruning,
                        "activations": student_text(recipe["target"], bool(recipe.get("learn_ranges"))),
                        "activation_points": built.activation_points,
                        "batch_norms_folded": built.batch_norms_folded},
            "activation_ranges": [list(a.held_range()) for a in act_fqs(student)],
            "loss_before": before[0], "loss_after": after[0],
            "agreement_before": before[1], "agreement_after": after[1], "holdout": held,
            "flows_back": "learned float weights (batch norms folded), and on jetson these activation ranges "
                          "(convert --option student_ranges=on imposes them where the tensors match); the "
                          "weight scales follow from the weights"}
