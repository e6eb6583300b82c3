"""Converters: one module per output format, all behind one small interface.

The registry maps a converter name (the ``converter`` field of a target profile) to the
module that implements it; the module is imported only when that target is used, so
listing targets or boards never imports torch, onnxruntime, coremltools or hls4ml.
A module exposes ``CONVERTER``, an object with ``convert(job) -> Artifact`` and
``host_runner(job, artifact) -> Runner`` (the real host runtime used by verify).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edgekit.errors import ProfileError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from edgekit.data import Dataset
    from edgekit.ingest import Model
    from edgekit.profiles import Board, Target

# name -> module path (lazily imported)
REGISTRY: dict[str, str] = {
    "hls4ml": "edgekit.converters.hls4ml",
    "tensorrt": "edgekit.converters.tensorrt",
    "tflite": "edgekit.converters.tflite",
    "coreml": "edgekit.converters.coreml",
}


@dataclass
class ConvertJob:
    model: Model
    target: Target
    board: Board
    precision: str
    calib: Dataset | None  # None only for fp32/fp16
    out_dir: Path  # the (temporary) output folder: write the artifact here
    work_dir: Path  # scratch space, deleted after the run
    options: dict[str, Any] = field(default_factory=dict)
    log: Callable[[str], None] = print
    float_onnx: Path | None = None  # the float ONNX export the analyze stage made (reuse it, don't export twice)
    warn: Callable[[str], None] = print
    float_tflite: Path | None = None  # the fp32 .tflite the analyze stage made from a Keras / SavedModel model


@dataclass
class Artifact:
    format: str
    precision: str
    primary: str  # file name (relative to out_dir) of the model artifact
    files: list[str]  # every file the converter wrote, relative to out_dir
    runtime: str  # host runtime used to verify, with version
    meta: dict[str, Any] = field(default_factory=dict)  # goes into the manifest
    notes: list[str] = field(default_factory=list)  # shown in the report


Runner = Callable[[dict[str, "np.ndarray"]], list["np.ndarray"]]


class Converter(Protocol):
    name: str

    def convert(self, job: ConvertJob) -> Artifact: ...

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner: ...


def load_firmware(runner: str, module: str = "run") -> Any:
    """Import ``firmware/<runner>/<module>.py``, the code the board runs, so that host
    verification and engine builds use it instead of a second copy."""
    import importlib.util
    import sys

    from edgekit.profiles import data_dir

    name = f"edgekit_firmware_{runner}_{module}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, data_dir("firmware") / runner / f"{module}.py")
        mod = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]


# What each converter takes as ``--option key=value``: name -> (kind, what it does). Kinds: "bool", "int>=N",
# "choice:a|b", "list" (TOML list or comma-separated names). Checked before anything runs (check_options).
COMMON_OPTIONS: dict[str, tuple[str, str]] = {
    "allow_float_fallback": ("bool", "build even where ops fall outside the target's list (kept float, warned)"),
}
OPTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "tensorrt": {"keep_float_nodes": ("list", "ONNX node names kept out of INT8 quantization")},
    "tflite": {
        "io": ("choice:int8|float", "int8 builds: int8 (default) or float32 input/output tensors"),
        "layout": ("choice:nchw|nhwc", "torch models: NHWC input via to_channel_last_io"),
        "threads": ("int>=1", "host interpreter threads for verification (default 2)"),
    },
    "coreml": {"weight_threshold": ("int>=0", "weights with fewer elements stay fp16 when compressing")},
    "hls4ml": {"fpga_scales": ("choice:po2|float", "power-of-two (default) or float quantizer scales")},
}


def check_options(converter: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``--option`` values checked against what the converter declares, normalised (bools, ints, lists).
    An unknown key or a bad value is a user error naming the key and what it takes."""
    from edgekit.errors import ConversionError

    known = {**COMMON_OPTIONS, **OPTIONS.get(converter, {})}
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key not in known:
            listed = ", ".join(f"{k} ({kind})" for k, (kind, _) in sorted(known.items()))
            raise ConversionError(f"--option {key}: not an option of converter {converter!r}; it takes: {listed}")
        kind = known[key][0]
        bad = f"--option {key}={value}: expected "
        if kind == "bool":
            out[key] = flag_option({key: value}, key)
        elif kind.startswith("int>="):
            low = int(kind[5:])
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConversionError(bad + f"an integer >= {low}")
            out[key] = value
        elif kind.startswith("choice:"):
            choices = kind[7:].split("|")
            if str(value).lower() not in choices:
                raise ConversionError(bad + " or ".join(choices))
            out[key] = str(value).lower()
        elif kind == "list":
            items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
                raise ConversionError(bad + 'node names, e.g. --option keep_float_nodes=conv1,conv2 or ["conv1"]')
            out[key] = items
    return out


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")


def flag_option(options: dict[str, Any] | None, key: str) -> bool:
    """A boolean ``--option key=value`` (true/false, 1/0, yes/no, on/off; absent = false): the one parser
    for converter flags, used by the pipeline and the converters alike."""
    from edgekit.errors import ConversionError

    v = (options or {}).get(key)
    if v is None or v is False:
        return False
    if v is True:
        return True
    text = str(v).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConversionError(f"--option {key}={v}: expected true or false")


def get_converter(name: str) -> Converter:
    if name not in REGISTRY:
        raise ProfileError(f"unknown converter {name!r}; registered: {', '.join(sorted(REGISTRY))}")
    module = importlib.import_module(REGISTRY[name])
    return module.CONVERTER
