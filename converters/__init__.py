"""Converters: one package per output format, all behind one small interface, registered in one table.

The registry maps a converter name (the ``converter`` field of a target profile) to what the converter is and
offers, declared as data: the module that implements it (imported only when that target is used, so listing
targets or boards never imports torch, onnxruntime, coremltools or hls4ml), the model kinds it takes, its
precisions, the extra that installs its toolchain, its ``--option`` model (also imported lazily) and what it
offers mixed precision (``mixed``: capability names of :mod:`edgekit.converters.capabilities`, each a typed
protocol; :meth:`ConverterInfo.offered` gives the converter as that protocol where it is declared).

A converter module exposes ``CONVERTER``, an object with ``convert(job) -> Artifact`` and
``host_runner(job, artifact) -> Runner`` (the real host runtime used by verify) and ``versions()`` (its
toolchain's, for the manifest): :mod:`edgekit.converters.job`.
What two converters share lives in :mod:`edgekit.converters.common`, below them; no converter imports another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

from edgekit.converters.capabilities import ACTIVATIONS16, LAYERS, UNSEARCHABLE
from edgekit.converters.job import (  # noqa: F401 - the converters' API, imported from here
    Artifact,
    Converter,
    ConvertJob,
    Runner,
    flag_option,
    load_firmware,
)
from edgekit.converters.options import ConverterOptions
from edgekit.errors import ProfileError

TORCH_INPUTS = ("exported_program", "torchscript", "factory", "pickle")


@dataclass(frozen=True)
class ConverterInfo:
    """What a converter is and takes: the one place ingest, pipeline and profiles ask."""

    module: str  # imported only when the converter runs; it defines CONVERTER
    inputs: tuple[str, ...]  # model kinds (edgekit.ingest.Model.kind) it converts
    precisions: tuple[str, ...]
    extra: str  # pip extra that installs its toolchain
    options_model: str  # "module:Class" of its --option model (pydantic only: cheap, but imported when asked)
    float_fallback: bool = False  # ops outside the target's list may stay float (allow_float_fallback)
    inputs_hint: str = ""  # what to do with a model kind it does not take
    mixed: frozenset[str] = frozenset()  # what it offers mixed precision (edgekit.converters.capabilities)
    speed: bool = False  # it times (or estimates) a build against the float build (capabilities.HostSpeed)

    @property
    def options(self) -> type[ConverterOptions]:
        module, name = self.options_model.split(":")
        return getattr(importlib.import_module(module), name)


CONVERTERS: dict[str, ConverterInfo] = {
    "tensorrt": ConverterInfo("edgekit.converters.tensorrt.converter", (*TORCH_INPUTS, "onnx"),
                              ("fp32", "fp16", "int8"), "jetson",
                              "edgekit.converters.tensorrt.options:TensorRTOptions",
                              mixed=frozenset({LAYERS}), speed=True),
    "tflite": ConverterInfo("edgekit.converters.tflite.converter", (*TORCH_INPUTS, "keras", "saved_model"),
                            ("fp32", "fp16", "int8-dynamic", "int8"), "android",
                            "edgekit.converters.tflite.options:TFLiteOptions", float_fallback=True,
                            mixed=frozenset({LAYERS, UNSEARCHABLE, ACTIVATIONS16}), speed=True,
                            inputs_hint="export the torch model with torch.export.save"),
    "coreml": ConverterInfo("edgekit.converters.coreml.converter", TORCH_INPUTS,
                            ("fp32", "fp16", "int8-weight", "int6-weight", "int4-weight", "prune-50", "int8"), "ios",
                            "edgekit.converters.coreml.options:CoreMLOptions", mixed=frozenset({LAYERS, UNSEARCHABLE}),
                            inputs_hint="give the .pt2 / "
                            "TorchScript / pkg.module:factory the model came from (coremltools dropped its ONNX "
                            "frontend)"),
    "hls4ml": ConverterInfo("edgekit.converters.fpga.converter", (*TORCH_INPUTS, "onnx"), ("int8", "int4"), "fpga",
                            "edgekit.converters.fpga.options:Hls4mlOptions"),
}


def converter_info(name: str) -> ConverterInfo:
    if name not in CONVERTERS:
        raise ProfileError(f"unknown converter {name!r}; registered: {', '.join(sorted(CONVERTERS))}")
    return CONVERTERS[name]


def check_options(converter: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``--option`` values validated by the converter's options model and normalised (bools, ints, lists);
    returns only the keys the user gave. An unknown key or a bad value names the key and what it takes."""
    from pydantic import ValidationError

    from edgekit.errors import ConversionError

    model = converter_info(converter).options
    try:
        parsed = model.model_validate(options or {})
    except ValidationError as exc:
        e = exc.errors()[0]
        key = ".".join(str(x) for x in e["loc"][:1]) or "?"
        takes = ", ".join(f"{k} ({_describe(f)})" for k, f in sorted(model.model_fields.items()))
        if e["type"] == "extra_forbidden":
            raise ConversionError(f"--option {key}: not an option of converter {converter!r}; it takes: {takes}") from None
        raise ConversionError(f"--option {key}={(options or {}).get(key)}: {e['msg']}; it takes: {takes}") from None
    return parsed.model_dump(exclude_unset=True)


def _describe(field: Any) -> str:
    from typing import get_args, get_origin

    ann = field.annotation
    lits = [x for a in (ann, *get_args(ann)) if get_origin(a) is Literal for x in get_args(a)]
    if lits:
        return " or ".join(map(str, lits))
    if ann is bool:
        return "true or false"
    if int in (ann, *get_args(ann)):
        return "an integer"
    if any(get_origin(a) is dict for a in (ann, *get_args(ann))):
        return "written by edgekit's own rebuilds"
    return "node names, comma-separated"


def get_converter(name: str) -> Converter:
    module = importlib.import_module(converter_info(name).module)
    return module.CONVERTER
