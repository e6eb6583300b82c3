"""Calibration and evaluation data: ``.npz`` files checked against the model's inputs.

A calibration file holds one array per model input (key = input name; a single-input
model may use any one key), first axis = samples: ``[N, *sample]``, the sample being the
input's shape without its batch axis (``--batch-axis``; the whole shape for an input that has
none). An eval file adds ``label`` (class indices). Samples are fed one batch at a time with
the model's own batch size, each input's samples moved to its batch axis.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgekit.errors import InputSpecError
from edgekit.fsutil import size_limit
from edgekit.ingest import Model
from edgekit.quiet import first_line
from edgekit.units import fmt_bytes

LABEL_KEYS = ("label", "labels", "y", "target", "targets")


@dataclass
class Dataset:
    source: str
    inputs: dict[str, np.ndarray]  # name -> [N, *sample_shape] per model input
    labels: np.ndarray | None
    random: bool = False
    # arrays of the file left unused: a carried state's (--carry), which the float model's own states replace
    unused: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def subset(self, indices: np.ndarray) -> Dataset:
        """The samples at ``indices`` (rows of every input, and of the labels)."""
        idx = np.asarray(indices, dtype=np.int64)
        return Dataset(self.source, {k: v[idx] for k, v in self.inputs.items()},
                       None if self.labels is None else self.labels[idx], self.random)

    def batches(self, model: Model, limit: int | None = None):
        """Yield feeds shaped like the model's inputs (batch = model batch size, each input's samples on its
        batch axis)."""
        bs = model.batch
        n = len(self) if limit is None else min(limit, len(self))
        for i in range(0, n - n % bs, bs):
            yield {s.name: s.to_model_layout(self.inputs[s.name][i : i + bs]) for s in model.inputs}


def draw(n_total: int, n: int, labels: np.ndarray | None, seed: int = 0) -> np.ndarray:
    """``n`` sample indices drawn across the whole file (never the first N), seeded; stratified by label when
    there are labels: every class gets its share (at least one sample each when ``n`` allows), so a class the
    converted model gets wrong shows in the golden set. Sorted."""
    rng = np.random.default_rng(seed)
    n = min(n, n_total)
    if labels is None or n >= n_total:
        return np.sort(rng.choice(n_total, size=n, replace=False))
    classes, counts = np.unique(labels, return_counts=True)
    share = np.maximum(1, np.floor(n * counts / counts.sum())).astype(int) if n >= len(classes) else \
        np.zeros(len(classes), dtype=int)
    if n < len(classes):  # fewer samples than classes: one each from n random classes
        share[rng.choice(len(classes), size=n, replace=False)] = 1
    share = np.minimum(share, counts)
    while share.sum() > n:  # rounding up to one per class overshot: trim the largest shares
        share[np.argmax(share)] -= 1
    rest = n - share.sum()
    while rest > 0:  # hand out what rounding down left, largest classes first, where samples remain
        room = counts - share
        k = int(np.argmax(room * (counts / counts.sum())))
        share[k] += 1
        rest -= 1
    picked = [rng.choice(np.flatnonzero(labels == c), size=s, replace=False) for c, s in zip(classes, share) if s]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


MAX_DATA_MB_ENV = "EDGEKIT_MAX_DATA_MB"
DEFAULT_MAX_DATA_MB = 1024.0


def max_data_bytes(max_mb: float | None = None) -> int:
    """The cap on the arrays one data file may expand to: ``max_mb``, else ``$EDGEKIT_MAX_DATA_MB``, else 1 GB."""
    return size_limit(max_mb, MAX_DATA_MB_ENV, DEFAULT_MAX_DATA_MB, "--max-data-mb", InputSpecError)


def _npy_header(fh, what: str, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from a .npy header, read before any data (numpy's own header parser)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(fh)
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0  # 3.0: utf-8 names
        shape, _fortran, dtype = read(fh)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise InputSpecError(f"{what}: array {key!r} has no readable .npy header ({exc}); "
                             "save the data with numpy.savez") from None
    return tuple(int(d) for d in shape), dtype


def _check_header(what: str, key: str, shape: tuple[int, ...], dtype: np.dtype, budget: list[int], cap: int) -> None:
    if dtype.hasobject:
        raise InputSpecError(f"{what}: array {key!r} holds Python objects (dtype {dtype}); edgekit never unpickles "
                             "data files: save numbers (e.g. float32) with numpy.savez")
    nbytes = int(np.prod(shape, dtype=np.float64) * dtype.itemsize)
    budget[0] += nbytes
    if budget[0] > cap:
        raise InputSpecError(
            f"{what}: array {key!r} {list(shape)} {dtype} expands to {fmt_bytes(budget[0])}, over the "
            f"{fmt_bytes(cap)} limit for data files; use fewer samples, or raise the limit with --max-data-mb "
            f"(or ${MAX_DATA_MB_ENV})"
        )


def _read_arrays(path: Path, what: str, cap: int) -> dict[str, np.ndarray]:
    """Every array of a .npz (or one .npy), each header checked against ``cap`` before its data is read."""
    budget = [0]
    with open(path, "rb") as fh:
        head = fh.read(6)
    if head == b"\x93NUMPY":
        with open(path, "rb") as fh:
            shape, dtype = _npy_header(fh, what, path.name)
            _check_header(what, path.name, shape, dtype, budget, cap)
        try:
            return {path.stem: np.load(path, allow_pickle=False)}
        except (ValueError, OSError, EOFError) as exc:
            raise InputSpecError(f"{what}: not a readable .npy file ({first_line(exc, 200)}); save it with numpy.save") from None
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as fh:
                    shape, dtype = _npy_header(fh, what, info.filename[:-4])
                _check_header(what, info.filename[:-4], shape, dtype, budget, cap)
        with np.load(path, allow_pickle=False) as z:  # zipfile checks each member's CRC as it reads it
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error) as exc:
        raise InputSpecError(f"{what}: not a readable .npz file ({first_line(exc, 200)}); save it with numpy.savez") from None


CALIB_LIMIT = float(np.finfo(np.float32).max) / 2  # largest |value| whose symmetric range float32 still holds


def check_values(what: str, key: str, arr: np.ndarray) -> None:
    """Numbers only, and finite: NaN/Inf/complex data would only fail later, far from its cause."""
    if np.iscomplexobj(arr):
        raise InputSpecError(f"{what}: array {key!r} is complex ({arr.dtype}); models take real inputs: "
                             "save the real part (or magnitude) you mean")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise InputSpecError(f"{what}: array {key!r} has dtype {arr.dtype}; expected numbers")
    if np.issubdtype(arr.dtype, np.floating):
        bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
        if bad:
            n_nan = int(np.count_nonzero(np.isnan(arr)))
            raise InputSpecError(f"{what}: array {key!r} holds {bad:,} non-finite value(s) ({n_nan:,} NaN, "
                                 f"{bad - n_nan:,} ±Inf) of {arr.size:,}; clean the data before calibrating or "
                                 "evaluating with it")
        # an INT8 quantizer's range is symmetric about zero at its widest: past half float32's largest value its
        # width, and the scale taken from it, overflow to inf (the quantizer then fails an assertion)
        peak = float(np.max(np.abs(arr))) if what.startswith("--calib") and arr.size else 0.0
        if peak > CALIB_LIMIT:
            raise InputSpecError(f"{what}: array {key!r} holds values up to {peak:.3g}: too large for INT8 "
                                 f"calibration (the finite range would overflow float32 scales above {CALIB_LIMIT:.3g}); "
                                 "calibrate with data scaled as the model sees it in use")


def _check_labels(what: str, labels: np.ndarray, model: Model) -> np.ndarray:
    """Class indices: integers (or integral floats), one per sample, within the classifier output's classes."""
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise InputSpecError(f"{what}: 'label' has shape {list(labels.shape)}; expected one class index per sample [N]")
    if not (np.issubdtype(labels.dtype, np.integer) or np.issubdtype(labels.dtype, np.floating)
            or labels.dtype == np.bool_):
        raise InputSpecError(f"{what}: 'label' has dtype {labels.dtype}; expected integer class indices (0, 1, 2, ...)")
    if np.issubdtype(labels.dtype, np.floating):
        if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
            raise InputSpecError(f"{what}: 'label' holds fractional or non-finite values; "
                                 "expected integer class indices (0, 1, 2, ...)")
    labels = labels.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise InputSpecError(f"{what}: 'label' holds negative values (min {labels.min()}); "
                             "expected class indices 0, 1, 2, ...")
    heads = [o for o in model.outputs if len(o.shape) == 2 and o.shape[1] > 1]
    if heads and labels.size:
        out = max(heads, key=lambda o: o.shape[1])
        if labels.max() >= out.shape[1]:
            raise InputSpecError(f"{what}: 'label' holds class {labels.max()}, but output {out.name!r} has "
                                 f"{out.shape[1]} classes (0..{out.shape[1] - 1}); check the labels or the model")
    return labels


def load_npz(path: str | Path, model: Model, need_labels: bool = False, what: str = "--calib",
             max_mb: float | None = None, generated: frozenset[str] | set[str] = frozenset()) -> Dataset:
    """The file's arrays checked against ``model``'s inputs; an input in ``generated`` (a carried state) needs no
    array: it is zeros here (edgekit.carry.with_states fills it), and an array given for it is left unused."""
    path = Path(path)
    if not path.exists():
        raise InputSpecError(f"{what} {path}: no such file")
    if not path.is_file():
        raise InputSpecError(f"{what} {path}: not a file; give a .npz saved with numpy.savez")
    arrays = _read_arrays(path, f"{what} {path}", max_data_bytes(max_mb))
    labels = None
    for k in LABEL_KEYS:
        if k in arrays:
            labels = arrays.pop(k)
            break
    if need_labels and labels is None:
        raise InputSpecError(f"{what} {path}: no labels; add an array named 'label' (class index per sample)")
    if labels is not None:
        labels = _check_labels(f"{what} {path}", labels, model)
    inputs: dict[str, np.ndarray] = {}
    unused = tuple(sorted(n for n in generated if arrays.pop(n, None) is not None))
    for spec in model.inputs:
        if spec.name in generated:
            continue
        if spec.name in arrays:
            key = spec.name
        elif len(model.inputs) == 1 and len(arrays) == 1:
            key = next(iter(arrays))
        else:
            raise InputSpecError(
                f"{what} {path}: no array for input {spec.name!r} (has {sorted(arrays)}); "
                f"name the array {spec.name!r}"
            )
        arr = arrays[key]
        sample = spec.sample_shape
        if arr.ndim == len(sample) and tuple(arr.shape) == sample and spec.batch == 1:
            arr = arr[None]
        if tuple(arr.shape[1:]) != sample:
            raise InputSpecError(f"{what} {path}: input {spec.name!r} has shape {list(arr.shape)}; "
                                 f"{_expects(spec)} (samples first){_shape_hint(spec, arr)}")
        check_values(f"{what} {path}", key, arr)
        inputs[spec.name] = np.ascontiguousarray(arr.astype(spec.dtype, copy=False))
    counts = {len(a) for a in inputs.values()}
    if len(counts) != 1 or 0 in counts:
        raise InputSpecError(f"{what} {path}: inputs have different or zero sample counts")
    if labels is not None and len(labels) != len(next(iter(inputs.values()))):
        raise InputSpecError(f"{what} {path}: {len(labels)} labels for {len(next(iter(inputs.values())))} samples")
    n = len(next(iter(inputs.values())))
    inputs = {s.name: inputs[s.name] if s.name in inputs else np.zeros((n, *s.sample_shape), s.dtype)
              for s in model.inputs}
    return Dataset(str(path), inputs, labels, False, unused)


def _expects(spec) -> str:
    """What a data file must hold for ``spec``: "the model expects [N, 2, 128]", with where the batch goes."""
    shown = f"the model expects [N, {', '.join(map(str, spec.sample_shape))}]"
    if spec.batch_axis is None:
        return shown + f" (no batch axis: each sample is the whole input {list(spec.shape)})"
    if spec.batch_axis:
        return shown + f" (edgekit moves the samples to batch axis {spec.batch_axis} of {list(spec.shape)})"
    return shown


def _shape_hint(spec, arr: np.ndarray) -> str:
    """Where a data array does not fit: the --batch-axis that would make it fit, or the NHWC transpose."""
    sample, shape, got = spec.sample_shape, tuple(spec.shape), tuple(arr.shape[1:])
    if spec.layout == "nhwc" and arr.ndim == 4 and len(sample) == 3 and got == (sample[2], sample[0], sample[1]):
        return ("; this array looks NCHW, the model takes NHWC (Keras / TensorFlow): "
                "save np.transpose(x, (0, 2, 3, 1)) instead")
    fits = [k for k in range(len(shape)) if shape[:k] + shape[k + 1:] == got and k != spec.batch_axis]
    if got == shape and spec.batch_axis is not None:
        fits.append(None)
    if fits:
        k = fits[0]
        return (f"; if the model's batch is on axis {k} of {spec.name!r} {list(shape)}, give --batch-axis "
                f"{spec.name}={k}" if k is not None else
                f"; if {spec.name!r} has no batch axis (each sample is the whole {list(shape)}), give --batch-axis "
                f"{spec.name}=none")
    return ""


def random_dataset(model: Model, n: int = 64, seed: int = 0) -> Dataset:
    """Uniform [0, 1) inputs: lets INT8 calibration run, says nothing about accuracy."""
    rng = np.random.default_rng(seed)
    bs = model.batch
    inputs = {s.name: rng.random((n * bs, *s.sample_shape)).astype(s.dtype) for s in model.inputs}
    return Dataset("random", inputs, None, True)
