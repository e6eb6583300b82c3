"""The model every stage reads: :class:`Model` (its source, kind, digest, fixed input / output spec, and the
loaded form a converter takes) and :class:`TensorSpec`. Ingest (edgekit.ingest) makes one; nothing later
changes its input spec."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.tf_graph import import_tensorflow


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str | None = None  # "nhwc" for image inputs of Keras / TensorFlow models; None = as given (torch: NCHW)
    # the axis that holds the batch (--batch-axis NAME=AXIS): 0 as usual, 1 for a recurrent state [layers, B, H];
    # None for a tensor with no batch axis (each sample is the whole tensor). Data files keep samples on axis 0.
    batch_axis: int | None = 0

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.layout:
            d["layout"] = self.layout
        if self.batch_axis != 0:
            d["batch_axis"] = "none" if self.batch_axis is None else self.batch_axis
        return d

    @property
    def batch(self) -> int:
        """The samples one run of the model takes on this tensor (1 where it has no batch axis)."""
        if self.batch_axis is None or not self.shape:
            return 1
        return int(self.shape[self.batch_axis])

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One sample's shape, as data files hold it after the sample axis: the batch axis taken out (the whole
        shape where the tensor has no batch axis)."""
        if self.batch_axis is None or not self.shape:
            return tuple(self.shape)
        return tuple(d for i, d in enumerate(self.shape) if i != self.batch_axis)

    def to_model_layout(self, samples: np.ndarray) -> np.ndarray:
        """``samples`` ([batch, *sample_shape], samples first) as the model takes them: the sample axis moved to
        the batch axis (a tensor without one takes its one sample as it is)."""
        if self.batch_axis is None:
            return samples[0]
        return np.moveaxis(samples, 0, self.batch_axis) if self.batch_axis else samples


TORCH_KINDS = ("exported_program", "torchscript", "factory", "pickle")
TF_KINDS = ("keras", "saved_model")
KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


@dataclass
class Model:
    source: str
    kind: str  # exported_program | torchscript | onnx | factory | pickle | keras | saved_model
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec] = field(default_factory=list)
    torch_module: Any = None  # callable torch module (eval mode) for torch kinds
    exported: Any = None  # torch.export.ExportedProgram when known
    onnx_path: Path | None = None  # float ONNX, for onnx kind or once exported
    tf_model: Any = None  # keras.Model, or the object tf.saved_model.load returned (keeps its variables alive)
    tf_function: Any = None  # tf ConcreteFunction: positional inputs (static shapes) -> tuple of outputs
    onnx_prep: Any = None  # edgekit.onnx_prepare.Prepared: how an ONNX file was made static (steps, consts)
    bridge: str | None = None  # "onnx2torch 1.5.15": an ONNX model rebuilt in torch for a torch-only converter
    _reference: Any = field(default=None, repr=False, compare=False)  # made once: an ONNX model's is a session

    @property
    def batch(self) -> int:
        """The samples one run takes: the batch-axis size of the first input that has a batch axis (1 where none
        has one)."""
        return next((s.batch for s in self.inputs if s.batch_axis is not None and s.shape), 1)

    @property
    def is_torch(self) -> bool:
        return self.kind in TORCH_KINDS

    @property
    def is_tf(self) -> bool:
        return self.kind in TF_KINDS

    def reference(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """The float model as a function of named numpy inputs (one batch); made once per Model (the
        data and verify stages both run it; for ONNX it holds an onnxruntime session)."""
        if self._reference is None:
            self._reference = self._make_reference()
        return self._reference

    def _make_reference(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        if self.is_tf:
            tf = import_tensorflow()
            fn = self.tf_function

            def run_tf(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                outs = fn(*[tf.constant(np.ascontiguousarray(feeds[s.name], dtype=s.dtype)) for s in self.inputs])
                return [np.asarray(o) for o in outs]

            return run_tf
        if self.is_torch and self.bridge is None:  # a bridged ONNX model's reference stays onnxruntime
            torch = require("torch")
            mod = self.torch_module

            def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                with torch.no_grad():
                    out = mod(*[torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in self.inputs])
                return [o.detach().cpu().numpy() for o in flatten_outputs(out)]

            return run
        ort = require("onnxruntime")
        sess = ort.InferenceSession(str(self.onnx_path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]

        def run_onnx(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return list(sess.run(names, feeds))

        return run_onnx

    def example_feeds(self) -> dict[str, np.ndarray]:
        return {s.name: np.zeros(s.shape, dtype=s.dtype) for s in self.inputs}

    def seeded_feeds(self, seed: int) -> dict[str, np.ndarray]:
        """Seeded inputs for comparing two forms of the model (float inputs uniform in [0, 1), others zero)."""
        rng = np.random.default_rng(seed)
        return {s.name: (rng.random(s.shape) if s.dtype.startswith("float") else np.zeros(s.shape)).astype(s.dtype)
                for s in self.inputs}


def flatten_outputs(out: Any) -> list[Any]:
    """The tensors of a model's output (nested tuples, lists, dicts), in order."""
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in flatten_outputs(x)]
    if isinstance(out, dict):
        return [y for x in out.values() for y in flatten_outputs(x)]
    return [out]
