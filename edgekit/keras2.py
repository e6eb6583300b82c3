"""Keras 2 files: ``.h5`` models written by tf.keras or standalone Keras 2.x, and SavedModels written by tf.keras,
told apart from Keras 3 files and read with tf-keras (``edgekit[keras]``), the Keras 2 that writes them.

Keras 3 cannot read many of them: a tf.keras ``DepthwiseConv2D`` carries ``groups`` in its config, which Keras 3's
layer refuses; a SavedModel that holds a Keras 2 optimizer needs tf-keras's optimizer class to load at all
(TensorFlow's SavedModel loader imports ``tf_keras`` itself for it, else fails with ``add_slot``).

Why tf-keras is imported here by name, in this process, and ``TF_USE_LEGACY_KERAS`` is not set: that variable only
decides what ``tf.keras`` names, and only if it is set before TensorFlow is first imported in the process. edgekit
never uses ``tf.keras``: it imports ``keras`` (3) for ``.keras`` files and ``tf_keras`` for Keras 2 files, and the
models of both are ordinary TensorFlow trackables that ``tf.function``, TFLiteConverter and tf2onnx take as they
are. Setting the variable from here would fail in a process that imported TensorFlow already (a notebook, an API
caller, ``edgekit matrix``) and would turn ``tf.keras`` into Keras 2 for the caller's own code; reading the file in
a child process instead would cost a second TensorFlow import (seconds) and a round trip through a file, for the
same model.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.deps import tensorflow_version, version
from edgekit.errors import MissingToolchainError, ModelLoadError
from edgekit.quiet import first_line

EXTRA_HINT = "pip install 'edgekit[keras]' (it brings tf-keras, the Keras 2 that reads these files)"


@dataclass(frozen=True)
class H5Model:
    """What a Keras ``.h5`` file's root attributes say: the Keras version that wrote it and its model config."""

    keras_version: str | None
    config: dict[str, Any] | None

    @property
    def keras2(self) -> bool:
        """Written by Keras 2 (tf.keras or standalone 2.x) or older: a version below 3, or, where the file does not
        say, a DepthwiseConv2D with ``groups`` (a key only tf.keras writes and Keras 3 refuses)."""
        if self.keras_version:
            major = self.keras_version.split(".")[0]
            return major.isdigit() and int(major) < 3
        return any(layer.get("class_name") == "DepthwiseConv2D" and "groups" in (layer.get("config") or {})
                   for layer in _layers(self.config))

    @property
    def writer(self) -> str:
        return f"Keras {self.keras_version}" if self.keras_version else "Keras 2"

    @property
    def lambda_layers(self) -> list[str]:
        """Names of the Lambda layers (Python code that loading would deserialize and run)."""
        return [str((layer.get("config") or {}).get("name", "?")) for layer in _layers(self.config)
                if str(layer.get("class_name", "")).split(">")[-1] == "Lambda"]


def read_h5(path: Path) -> H5Model | None:
    """The root attributes of a Keras ``.h5`` file, read with h5py before TensorFlow is imported; None for a file
    h5py cannot open (damaged, or not HDF5: the Keras loader then says why) or one without h5py installed."""
    try:
        import h5py
    except ImportError:
        return None
    try:
        with h5py.File(path, "r") as f:
            ver, cfg = f.attrs.get("keras_version"), f.attrs.get("model_config")
    except Exception:  # noqa: BLE001 - h5py raises OSError, KeyError ... for damaged files
        return None
    ver = ver.decode() if isinstance(ver, bytes) else (str(ver) if ver is not None else None)
    config = None
    if cfg is not None:
        try:
            config = json.loads(cfg.decode() if isinstance(cfg, bytes) else str(cfg))
        except ValueError:
            config = None
    return H5Model(ver, config if isinstance(config, dict) else None)


def _layers(config: Any) -> list[dict[str, Any]]:
    """Every layer config in a Keras model config, nested models and wrappers (TimeDistributed ...) included."""
    found: list[dict[str, Any]] = []
    todo = [config]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if "class_name" in node:
                found.append(node)
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


def is_keras2_saved_model(path: Path) -> bool:
    """A SavedModel written by tf.keras (``model.save(folder)`` in Keras 2) carries ``keras_metadata.pb``; Keras 3's
    ``model.export`` and ``tf.saved_model.save`` do not write it."""
    return (path / "keras_metadata.pb").is_file()


def import_tf_keras() -> Any | None:
    """tf-keras, or None where it is not installed. A tf-keras whose release is not TensorFlow's is refused: each
    tf-keras release works with its own TensorFlow release only."""
    try:
        tfk = importlib.import_module("tf_keras")
    except ImportError:
        return None
    tf_ver, tfk_ver = _major_minor(tensorflow_version()), _major_minor(version("tf-keras"))
    if tf_ver and tfk_ver and tf_ver != tfk_ver:
        raise MissingToolchainError(
            f"tf-keras {version('tf-keras')} is installed beside TensorFlow {tensorflow_version()}; a tf-keras "
            f"release reads files only with its own TensorFlow release: pip install 'tf-keras=={tf_ver}.*'")
    return tfk


def _major_minor(v: str | None) -> str | None:
    return ".".join(v.split(".")[:2]) if v else None


def load_keras2_h5(path: Path, info: H5Model) -> Any:
    """A Keras 2 ``.h5`` model, read with tf-keras; where tf-keras is not installed, Keras 3 is tried (it reads
    many Keras 2 files) and its failure is reported as what it is, with the extra that brings tf-keras."""
    tfk = import_tf_keras()
    if tfk is not None:
        try:
            # safe_mode does not stop a Lambda in an .h5 (tf-keras deserializes its bytecode anyway): the caller
            # refuses Lambda layers from the config before this runs, unless --trust-pickle
            return tfk.models.load_model(str(path), compile=False)
        except Exception as exc:  # noqa: BLE001 - tf-keras / h5py raise many types for damaged or foreign files
            raise ModelLoadError(
                f"{path}: written by {info.writer}; tf-keras {version('tf-keras')} cannot load it "
                f"({type(exc).__name__}: {first_line(exc)}); is the file complete? a layer that is not a built-in "
                "one (a custom class) cannot be read: re-save the model from the code that defines it"
            ) from None
    import keras

    try:
        return keras.models.load_model(str(path), compile=False, safe_mode=True)
    except Exception as exc:  # noqa: BLE001 - keras raises many types for what it cannot read
        raise ModelLoadError(
            f"{path}: written by {info.writer} (tf.keras); Keras 3 cannot read it ({type(exc).__name__}: "
            f"{first_line(exc, 160)}); {EXTRA_HINT}"
        ) from None


def keras2_saved_model_error(path: Path, exc: BaseException) -> ModelLoadError:
    """The refusal of a tf.keras SavedModel that TensorFlow could not load (an optimizer it saved needs tf-keras)."""
    cause = f"({type(exc).__name__}: {first_line(exc, 120)})"
    if import_tf_keras() is None:
        return ModelLoadError(f"{path}: written by Keras 2 (tf.keras) with its optimizer, which only tf-keras can "
                              f"read back {cause}; {EXTRA_HINT}")
    return ModelLoadError(f"{path}: written by Keras 2 (tf.keras); TensorFlow cannot load it even with tf-keras "
                          f"{version('tf-keras')} {cause}; is the folder complete? re-save it from the code that "
                          "made it")


def read_by_tf_keras(model: Any) -> bool:
    """Whether a loaded Keras model is a tf-keras one (a Keras 2 file), for the toolchain record."""
    return type(getattr(model, "tf_model", None)).__module__.split(".")[0] == "tf_keras"
