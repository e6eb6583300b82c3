"""Calibration and evaluation data: ``.npz`` files checked against the model's inputs.

A calibration file holds one array per model input (key = input name; a single-input
model may use any one key), first axis = samples. An eval file adds ``label`` (class
indices). Samples are fed one batch at a time with the model's own batch size.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.errors import InputSpecError
from edgekit.ingest import Model

LABEL_KEYS = ("label", "labels", "y", "target", "targets")


@dataclass
class Dataset:
    source: str
    inputs: dict[str, np.ndarray]  # name -> [N, *sample_shape] per model input
    labels: np.ndarray | None
    random: bool = False

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def batches(self, model: Model, limit: int | None = None):
        """Yield feeds shaped like the model's inputs (batch = model batch size)."""
        bs = model.inputs[0].shape[0] if model.inputs[0].shape else 1
        n = len(self) if limit is None else min(limit, len(self))
        for i in range(0, n - n % bs, bs):
            yield {s.name: self.inputs[s.name][i : i + bs] for s in model.inputs}


def load_npz(path: str | Path, model: Model, need_labels: bool = False, what: str = "--calib") -> Dataset:
    path = Path(path)
    if not path.exists():
        raise InputSpecError(f"{what} {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise InputSpecError(f"{what} {path}: not a readable .npz file ({exc}); save it with numpy.savez") from None
    labels = None
    for k in LABEL_KEYS:
        if k in arrays:
            labels = arrays.pop(k)
            break
    if need_labels and labels is None:
        raise InputSpecError(f"{what} {path}: no labels; add an array named 'label' (class index per sample)")
    inputs: dict[str, np.ndarray] = {}
    for spec in model.inputs:
        if spec.name in arrays:
            arr = arrays[spec.name]
        elif len(model.inputs) == 1 and len(arrays) == 1:
            arr = next(iter(arrays.values()))
        else:
            raise InputSpecError(
                f"{what} {path}: no array for input {spec.name!r} (has {sorted(arrays)}); "
                f"name the array {spec.name!r}"
            )
        sample = tuple(spec.shape[1:])
        if arr.ndim == len(spec.shape) - 1 and tuple(arr.shape) == tuple(spec.shape[1:]) and spec.shape[0] == 1:
            arr = arr[None]
        if tuple(arr.shape[1:]) != sample:
            hint = ""
            if spec.layout == "nhwc" and arr.ndim == 4 and tuple(arr.shape[1:]) == (sample[2], sample[0], sample[1]):
                hint = ("; this array looks NCHW, the model takes NHWC (Keras / TensorFlow): "
                        "save np.transpose(x, (0, 2, 3, 1)) instead")
            raise InputSpecError(
                f"{what} {path}: input {spec.name!r} has shape {list(arr.shape)}; "
                f"the model expects [N, {', '.join(map(str, sample))}] (samples first){hint}"
            )
        if not np.issubdtype(arr.dtype, np.number):
            raise InputSpecError(f"{what} {path}: input {spec.name!r} has dtype {arr.dtype}; expected numbers")
        inputs[spec.name] = np.ascontiguousarray(arr.astype(spec.dtype, copy=False))
    counts = {len(a) for a in inputs.values()}
    if len(counts) != 1 or 0 in counts:
        raise InputSpecError(f"{what} {path}: inputs have different or zero sample counts")
    if labels is not None and len(labels) != len(next(iter(inputs.values()))):
        raise InputSpecError(f"{what} {path}: {len(labels)} labels for {len(next(iter(inputs.values())))} samples")
    return Dataset(str(path), inputs, None if labels is None else labels.astype(np.int64), False)


def random_dataset(model: Model, n: int = 64, seed: int = 0) -> Dataset:
    """Uniform [0, 1) inputs: lets INT8 calibration run, says nothing about accuracy."""
    rng = np.random.default_rng(seed)
    bs = model.inputs[0].shape[0]
    inputs = {s.name: rng.random((n * bs, *s.shape[1:])).astype(s.dtype) for s in model.inputs}
    return Dataset("random", inputs, None, True)
