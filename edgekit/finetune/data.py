"""The data a run distills on: unlabeled inputs (a ``.npz``, a folder of ``.npy`` files, an array), split into
training and held-out samples, with the float model's output kinds that choose the loss."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit.data import Dataset
from edgekit.deps import require
from edgekit.errors import InputSpecError
from edgekit.finetune.losses import loss_kinds
from edgekit.ingest import Model
from edgekit.lineage import data_digest


def load_unlabeled(path: str | Path, model: Model, max_mb: float | None = None) -> Dataset:
    """Inputs to distill on: a ``.npz`` (as ``--calib``; labels are ignored) or a folder of ``.npy`` files
    (single-input models; each one sample or a stack of samples)."""
    from edgekit.data import check_values, load_npz

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
        check_values(f"--data {f}", spec.name, a)
        arrays.append(a.astype(spec.dtype, copy=False))
    return Dataset(str(path), {spec.name: np.ascontiguousarray(np.concatenate(arrays))}, None, False)


def tensors(data: Dataset, model: Model):
    """The samples as torch tensors, one per model input, in the model's input order."""
    torch = require("torch")
    return [torch.from_numpy(np.ascontiguousarray(data.inputs[s.name])) for s in model.inputs]


@dataclass
class RunData:
    train: Dataset
    held: Dataset | None  # --holdout: the samples kept out of training
    digest: str  # sha256 of all the given inputs (before the holdout split): a resume checks the same data
    kinds_by_name: dict[str, str] = field(default_factory=dict)  # each output's kind, as verify infers it
    kinds: list[str] = field(default_factory=list)  # what the loss reads, in output order (losses.loss_kinds)


def prepare(m: Model, data: str | Path | Dataset | np.ndarray, max_mb: float | None, holdout: float,
            seed: int) -> RunData:
    """The data loaded and split (``holdout`` of it drawn with ``seed``); the output kinds come after, from
    :func:`output_kinds`, once the data is known to make a batch."""
    if isinstance(data, np.ndarray):
        if len(m.inputs) != 1:
            raise InputSpecError("an array of inputs feeds a single-input model; give a Dataset or a .npz")
        data = Dataset("array", {m.inputs[0].name: np.ascontiguousarray(data, dtype=m.inputs[0].dtype)}, None)
    ds = data if isinstance(data, Dataset) else load_unlabeled(data, m, max_mb)
    digest = data_digest(ds, m)  # of the whole file: a resume checks the same data
    held_ds = None
    if holdout:
        k = max(1, round(len(ds) * holdout))
        order = np.random.default_rng(seed).permutation(len(ds))
        held_ds, ds = ds.subset(np.sort(order[:k])), ds.subset(np.sort(order[k:]))
    return RunData(ds, held_ds, digest)


def output_kinds(m: Model, run: RunData) -> None:
    """Fill in ``run``'s output kinds from the float model's outputs on the training samples."""
    from edgekit.verify import infer_kinds, reference_outputs

    ref = reference_outputs(m, m.reference(), run.train)
    run.kinds_by_name = infer_kinds(m, m.reference(), run.train, outputs=ref)
    run.kinds = loss_kinds([run.kinds_by_name[s.name] for s in m.outputs], ref)
