"""TensorFlow models in: Keras (``.keras``, ``.h5``) and SavedModel folders, read with TensorFlow
(``edgekit[keras]``; Keras 2 files with tf-keras, :mod:`edgekit.keras2`), traced at their fixed input shapes into one ConcreteFunction (the float reference and what
TFLiteConverter converts)."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit.deps import require
from edgekit.errors import InputSpecError, ModelLoadError
from edgekit.fsutil import sha256_file
from edgekit.input_spec import does_not_run, tf_inputs
from edgekit.keras2 import is_keras2_saved_model, keras2_saved_model_error, load_keras2_h5, read_h5
from edgekit.model import Model, TensorSpec
from edgekit.quiet import first_line
from edgekit.tf_graph import TF_EXTRA, import_tensorflow, tf_arg_name


def load_keras(path: Path, shapes, trust_pickle: bool = False) -> Model:
    """A .keras / .h5 file (a Lambda layer's Python only with ``trust_pickle``)."""
    if path.suffix.lower() == ".keras" and not zipfile.is_zipfile(path):  # checked before importing TensorFlow
        raise ModelLoadError(
            f"{path}: not a Keras archive (a .keras file is a zip; this one is truncated or another format); "
            "re-save it with model.save('model.keras')"
        )
    legacy = None
    if path.suffix.lower() in (".h5", ".hdf5"):  # its root attributes, read before TensorFlow is imported
        info = read_h5(path)
        if info is not None and info.lambda_layers and not trust_pickle:
            raise ModelLoadError(
                f"{path}: the model holds Lambda layer(s) {', '.join(info.lambda_layers[:3])} (Python code that "
                "loading would run); pass --trust-pickle if you trust its source, or replace the Lambda with a "
                "built-in layer")
        legacy = info if info is not None and info.keras2 else None
    import_tensorflow()
    digest = sha256_file(path)
    if legacy is not None:  # written by Keras 2 (tf.keras): read with tf-keras (edgekit.keras2)
        return _finish_keras(path, load_keras2_h5(path, legacy), digest, shapes)
    keras = require("keras", TF_EXTRA)
    try:
        # safe_mode: a Lambda layer's Python bytecode is not deserialized (Keras refuses it) unless trusted
        km = keras.models.load_model(str(path), compile=False, safe_mode=not trust_pickle)
    except Exception as exc:  # keras / h5py raise many types for damaged or foreign files
        if "safe_mode" in str(exc) or "Lambda" in str(exc):
            raise ModelLoadError(
                f"{path}: the model holds a Lambda layer (Python code that loading would run); "
                "pass --trust-pickle if you trust its source, or replace the Lambda with a built-in layer"
            ) from None
        raise ModelLoadError(
            f"{path}: Keras cannot load the model ({type(exc).__name__}: {first_line(exc)}); "
            "is the file complete? re-save it with model.save('model.keras')"
        ) from None
    return _finish_keras(path, km, digest, shapes)


def _finish_keras(path: Path, km: Any, digest: str, shapes) -> Model:
    """The input spec of a loaded Keras model (Keras 3, or Keras 2 read by tf-keras) and its traced reference."""
    try:
        graph_inputs = list(km.inputs or [])
    except (AttributeError, ValueError):
        graph_inputs = []
    if not graph_inputs and not shapes:
        raise InputSpecError(
            f"{path}: the Keras model has no defined input (a Sequential without keras.Input); "
            "give --input-shape (NHWC, e.g. 1,224,224,3)"
        )
    if graph_inputs:
        found = [(_clean_name(getattr(t, "name", None), i), tuple(t.shape), _dtype_name(getattr(t, "dtype", "float32")))
                 for i, t in enumerate(graph_inputs)]
    else:
        found = [(name or f"input_{i}", tuple(None for _ in shape), "float32") for i, (name, shape) in enumerate(shapes)]
    inputs = tf_inputs(str(path), found, shapes)
    channels_first = any(getattr(layer, "data_format", None) == "channels_first" for layer in _keras_layers(km))
    inputs = [TensorSpec(s.name, s.shape, s.dtype, None if channels_first or len(s.shape) != 4 else "nhwc")
              for s in inputs]

    def call(*xs):
        return km(list(xs) if len(xs) > 1 else xs[0], training=False)

    model = Model(str(path), "keras", digest, inputs, tf_model=km)
    return _finish_tf(model, call, None)


def _keras_layers(km: Any) -> list[Any]:
    try:
        return list(km._flatten_layers(include_self=False))
    except Exception:  # noqa: BLE001 - older / other Model classes
        return list(getattr(km, "layers", []))


def load_saved_model(path: Path, shapes, trust_pickle: bool = False) -> Model:
    """A SavedModel folder, through its serving_default signature (a graph that touches files or calls Python:
    only with ``trust_pickle``)."""
    from edgekit.fsutil import sha256_tree
    from edgekit.safety import check_saved_model

    tf = import_tensorflow()
    check_saved_model(path, str(path), trust_pickle)  # a graph that touches files or calls Python: trusted only
    digest = sha256_tree(path)
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        why = first_line(exc)
        if is_keras2_saved_model(path) or "add_slot" in why or "_UserObject" in why:
            # written by tf.keras: TensorFlow's loader imports tf-keras itself for a saved Keras 2 optimizer
            raise keras2_saved_model_error(path, exc) from None
        raise ModelLoadError(
            f"{path}: TensorFlow cannot load the SavedModel ({type(exc).__name__}: {why}); "
            "is the folder complete? re-export it (model.export(folder) or tf.saved_model.save)"
        ) from None
    sigs = dict(getattr(loaded, "signatures", {}) or {})
    if "serving_default" not in sigs:
        raise ModelLoadError(
            f"{path}: the SavedModel has no 'serving_default' signature (it has {sorted(sigs) or 'none'}); "
            "export it with model.export(folder) or tf.saved_model.save(obj, folder, signatures=...)"
        )
    sig = sigs["serving_default"]
    _, kw = sig.structured_input_signature
    names = sorted(kw)
    found = [(n, tuple(kw[n].shape.as_list() if kw[n].shape.rank is not None else ()), kw[n].dtype.name)
             for n in names]
    inputs = tf_inputs(str(path), found, shapes)
    inputs = [TensorSpec(s.name, s.shape, s.dtype, "nhwc" if len(s.shape) == 4 else None) for s in inputs]
    out_names = sorted(sig.structured_outputs)

    def call(*xs):
        out = sig(**{n: x for n, x in zip(names, xs, strict=True)})
        return [out[k] for k in out_names]

    model = Model(str(path), "saved_model", digest, inputs, tf_model=loaded)
    return _finish_tf(model, call, out_names)


def _finish_tf(model: Model, call: Callable[..., Any], out_names: list[str] | None) -> Model:
    """Trace the model at the fixed input shapes into one ConcreteFunction (the float reference and
    what TFLiteConverter converts), run it once on zeros, and fix the output spec."""
    tf = import_tensorflow()
    sig = [tf.TensorSpec(s.shape, s.dtype, name=tf_arg_name(s.name, i)) for i, s in enumerate(model.inputs)]

    def flat(*xs):
        return tuple(tf.nest.flatten(call(*xs)))

    try:
        model.tf_function = tf.function(flat, input_signature=sig, autograph=False).get_concrete_function()
        outs = model.reference()(model.example_feeds())
    except Exception as exc:
        raise does_not_run(model, exc, "check --input-shape (NHWC for Keras)") from None
    names = out_names if out_names and len(out_names) == len(outs) else (
        ["output"] if len(outs) == 1 else [f"output_{i}" for i in range(len(outs))])
    model.outputs = [TensorSpec(n, tuple(o.shape), str(o.dtype)) for n, o in zip(names, outs, strict=True)]
    return model


def _dtype_name(dtype: Any) -> str:
    """"float32" from Keras 3 (a string) and from tf-keras (a tf.DType)."""
    return str(getattr(dtype, "name", dtype))


def _clean_name(name: str | None, i: int) -> str:
    return name if name else f"input_{i}"
