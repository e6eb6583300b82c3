"""Ingest: a model file or ``pkg.module:factory`` -> :class:`Model`.

Kinds: torch ExportedProgram (``.pt2``), TorchScript (``.pt``/``.pth`` zip with code),
ONNX (``.onnx``), a factory returning an ``nn.Module`` (with ``--input-shape``), a
pickled ``nn.Module`` only with ``trust_pickle=True`` (``torch.load`` runs code from the
file; the default is weights-only), and Keras (``.keras``, ``.h5``) or a TensorFlow
SavedModel folder (holds ``saved_model.pb``), read with TensorFlow (``edgekit[keras]``).
The input spec (names, shapes, dtypes, layout) is fixed here; every later stage reads it
from the Model.

This module picks the loader by the source's name; the loaders are per format
(:mod:`edgekit.ingest_torch`, :mod:`edgekit.ingest_onnx`, :mod:`edgekit.ingest_tf`), the types in
:mod:`edgekit.model`, which kinds a target takes in :mod:`edgekit.converter_inputs`; the names the
pipeline reads are re-exported here.
"""

from __future__ import annotations

import re
from pathlib import Path

from edgekit.converter_inputs import check_target_takes, for_converter, source_kind, takes_onnx, takes_via_bridge
from edgekit.errors import InputSpecError, ModelLoadError
from edgekit.ingest_onnx import load_onnx
from edgekit.ingest_tf import load_keras, load_saved_model
from edgekit.ingest_torch import load_factory, load_torch_file
from edgekit.input_spec import apply_batch_axes, parse_batch_axes, parse_shapes
from edgekit.model import KERAS_SUFFIXES, TF_KINDS, TORCH_KINDS, Model, TensorSpec

__all__ = ["FACTORY_RE", "KERAS_SUFFIXES", "TF_KINDS", "TORCH_KINDS", "Model", "TensorSpec", "check_target_takes",
           "for_converter", "load_model", "parse_shapes", "source_kind", "takes_onnx", "takes_via_bridge"]

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def load_model(
    source: str | Path,
    input_shapes: list[str] | None = None,
    trust_pickle: bool = False,
    consts: list[str] | None = None,
    batch_axes: list[str] | None = None,
) -> Model:
    """Load ``source`` and fix its input spec. Raises :class:`ModelLoadError` on bad files.
    ``consts`` (``name=value``, ONNX only) folds inputs into the graph as constants; ``batch_axes``
    (``name=AXIS`` or ``name=none``) says which axis of an input or output holds the batch where it is not 0."""
    axes = parse_batch_axes(batch_axes)
    return apply_batch_axes(_load(source, parse_shapes(input_shapes), trust_pickle, consts, axes), axes)


def _load(source: str | Path, shapes, trust_pickle: bool, consts: list[str] | None,
          axes: dict[str, int | None]) -> Model:
    if consts and not str(source).lower().endswith(".onnx"):
        raise InputSpecError("--const folds an input of an ONNX model into its graph; this model is not ONNX "
                             "(fix the value in the model's code before exporting it)")
    src = str(source)
    path = Path(src)
    if not path.exists() and FACTORY_RE.match(src):
        return load_factory(src, shapes)
    if not path.exists():
        raise ModelLoadError(f"{src}: no such file (give a model file or pkg.module:factory)")
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return load_saved_model(path, shapes, trust_pickle)
        raise ModelLoadError(
            f"{src} is a folder without saved_model.pb; give the model file (.pt2, .onnx, .pt, .keras, .h5) "
            "or a TensorFlow SavedModel folder"
        )
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{src} is empty; re-save the model")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return load_onnx(path, shapes, consts, axes)
    if suffix in (".pt2", ".pt", ".pth", ".ts", ".torchscript", ".jit"):
        return load_torch_file(path, shapes, trust_pickle)
    if suffix in KERAS_SUFFIXES:
        return load_keras(path, shapes, trust_pickle)
    raise ModelLoadError(
        f"{src}: unknown model file type {suffix or '(none)'}; edgekit reads .pt2 (torch.export), "
        ".pt/.pth (TorchScript or, with --trust-pickle, a pickled module), .onnx, .keras/.h5 (Keras), "
        "a SavedModel folder, or pkg.module:factory"
    )
