"""Lazy imports of the heavy toolchains, each tied to the extra that installs it."""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

from edgekit.errors import MissingToolchainError

# import name -> (distribution name, extra that installs it)
KNOWN = {
    "torch": ("torch", "torch"),
    "onnx": ("onnx", "jetson"),
    "onnxruntime": ("onnxruntime", "jetson"),
    "onnxslim": ("onnxslim", "jetson"),
    "onnxscript": ("onnxscript", "jetson"),
    "tensorflow": ("tensorflow", "keras"),  # only for Keras / SavedModel input
    "keras": ("keras", "keras"),
    "tf_keras": ("tf-keras", "keras"),  # Keras 2 (tf.keras) .h5 / SavedModel input
    "tf2onnx": ("tf2onnx", "keras"),  # Keras / SavedModel -> ONNX for jetson, ios, fpga
}


def require(module: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise a one-line error naming the pip extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        dist, default_extra = KNOWN.get(top, (top, None))
        extra = extra or default_extra
        if top == "torch":
            hint = "install PyTorch first (CPU build: pip install torch), then edgekit"
        elif extra:
            hint = f"pip install 'edgekit[{extra}]'"
        else:
            hint = f"pip install {dist}"
        raise MissingToolchainError(f"{module} is needed here but cannot be imported ({exc}); {hint}") from None


def version(dist: str) -> str | None:
    """Installed version of a distribution, or None; never imports it."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# distributions that install the `tensorflow` package: edgekit[keras] installs `tensorflow`; a user may have
# tensorflow-cpu instead (the same `tensorflow/` folder), so both are looked up, `tensorflow` first
TF_DISTS = ("tensorflow", "tensorflow-cpu")


def tensorflow_dist() -> str | None:
    """The installed distribution that provides TensorFlow (``tensorflow``, else ``tensorflow-cpu``), or None."""
    return next((d for d in TF_DISTS if version(d)), None)


def tensorflow_version() -> str | None:
    """TensorFlow's installed version, whichever distribution brought it; never imports it."""
    return version(d) if (d := tensorflow_dist()) else None


def toolchain_versions(*dists: str) -> dict[str, str]:
    return {d: v for d in dists if (v := version(d))}
