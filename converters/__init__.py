"""Converters: one module per output format, all behind one small interface.

The registry maps a converter name (the ``converter`` field of a target profile) to the
module that implements it; the module is imported only when that target is used, so
listing targets or boards never imports torch, onnxruntime, coremltools or hls4ml.
A module exposes ``CONVERTER``, an object with ``convert(job) -> Artifact`` and
``host_runner(job, artifact) -> Runner`` (the real host runtime used by verify).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgekit.errors import ProfileError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from edgekit.data import Dataset
    from edgekit.ingest import Model
    from edgekit.profiles import Board, Target

TORCH_INPUTS = ("exported_program", "torchscript", "factory", "pickle")


class _Options(BaseModel):
    """``--option key=value`` of a converter: unknown keys and bad values are refused, never dropped."""

    model_config = ConfigDict(extra="forbid")
    allow_float_fallback: bool = Field(False, description="build even where ops fall outside the target's list")

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) and v.strip().lower() in _CHOICE_WORDS else v


class TensorRTOptions(_Options):
    keep_float_nodes: list[str] = Field(default_factory=list, description="ONNX node names kept out of INT8")
    calibration: Literal["auto", "minmax", "percentile", "percentile-99.99", "entropy", "mse"] = Field(
        "auto", description="INT8 activation ranges: auto (each method is tried and the one whose model is closest "
        "to float on calibration samples wins), minmax (the observed range), percentile (clips |x| at the 99.999th "
        "percentile), percentile-99.99, entropy (KL-optimal threshold, 2048 bins) or mse (the range of least "
        "rounding + clipping error over the histogram)")
    qdq: Literal["tensorrt", "all"] = Field(
        "tensorrt", description="INT8 Q/DQ placement: tensorrt (TensorRT's guidance, as NVIDIA ModelOpt: the inputs of "
        "convolutions, GEMM/MatMul and average pooling; the rest runs fp16) or all (onnxruntime's default: every op "
        "it quantizes, inputs and outputs)")

    bias_correction: Literal["auto", "on", "off"] = Field(
        "off", description="INT8: take the mean shift int8 puts in each quantized conv / GEMM output channel out of "
        "its bias (measured on calibration data, layer by layer): off (default: on the zoo's classifiers it measured "
        "no better, docs/finetune.md), auto (applied where the model gets closer to float on calibration samples) "
        "or on")
    equalize: Literal["auto", "on", "off"] = Field(
        "off", description="INT8: make the channels of each tensor a convolution feeds a depthwise convolution "
        "(directly or through a ReLU) span the same range, the scales moved into the two layers' per-channel "
        "weights, so its per-tensor INT8 range serves every channel: off (default: on the zoo's ppocr-cls it measured "
        "+2 dB all-INT8 and no better with mixed precision, docs/finetune.md), auto (applied where the model gets "
        "closer to float on calibration samples) or on")
    student_ranges: Literal["on", "off"] = Field(
        "off", description="INT8 of a .pt2 that edgekit finetune wrote for jetson: on imposes the activation ranges "
        "its student trained with on the tensors that hold the same values, so the build computes what the student "
        "did, and checks it against the float model it was fine-tuned from; off (default: on ppocr-cls +0.8 points "
        "of agreement, but a larger worst-case output error, docs/finetune.md) calibrates them from --calib")
    _names = field_validator("keep_float_nodes", mode="before")(lambda cls, v: _split_names(v))


class TFLiteOptions(_Options):
    calibration: Literal["auto", "histogram", "minmax"] = Field(
        "auto", description="int8 activation observer: auto (each is tried and the one whose model is closest to "
        "float on calibration samples wins), histogram (HistogramObserver, L2-optimal range) or minmax")
    keep_float_nodes: list[str] = Field(default_factory=list, description="torch.export node names kept float")
    io: Literal["int8", "float"] = Field("int8", description="int8 builds: int8 or float32 input/output tensors")
    lstm: Literal["int8", "float"] = Field(
        "int8", description="int8 builds: LSTMs written out per time step in int8 (FULLY_CONNECTED / LOGISTIC / TANH "
        "/ MUL / ADD), or kept float (litert-torch writes it out per step in fp32 between DEQUANTIZE and QUANTIZE)")
    layout: Literal["nchw", "nhwc"] | None = Field(None, description="torch models: NHWC input (to_channel_last_io)")
    threads: int = Field(2, ge=1, le=256, description="host interpreter threads for verification")
    activations: Literal["int8", "int16"] = Field(
        "int8", description="int8 builds: int8 activations, or int16 (TFLite's 16x8 mode by ai-edge-quantizer: int8 "
        "weights, int16 activations and I/O; closer to float, slower: no XNNPACK/GPU/NNAPI kernels). Unset, mixed "
        "precision tries int16 last where an int8 build fails verification")
    keep_float_tensors: list[str] = Field(
        default_factory=list, description="with activations=int16: ops kept float in the 16x8 model, named by their "
        "output tensor in the fp32 .tflite (mixed precision's 16x8 layer search writes these)")
    keras: Literal["tflite", "onnx"] = Field(
        "tflite", description="Keras / SavedModel input: tflite (TensorFlow's TFLiteConverter quantizes the whole "
        "model) or onnx (tf2onnx, then the PT2E path of ONNX and torch input: INT8 mixed precision can keep "
        "chosen layers float there)")
    _names = field_validator("keep_float_nodes", "keep_float_tensors", mode="before")(
        lambda cls, v: _split_names(v))


class CoreMLOptions(_Options):
    weight_threshold: int | None = Field(None, ge=0, description="weights with fewer elements stay fp16")


class Hls4mlOptions(_Options):
    fpga_scales: Literal["po2", "float"] = Field("po2", description="power-of-two or float quantizer scales")


def _split_names(v: Any) -> Any:
    return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v


_CHOICE_WORDS = {"int8", "float", "nchw", "nhwc", "po2", "true", "false", "yes", "no", "on", "off"}


@dataclass(frozen=True)
class ConverterInfo:
    """What a converter is and takes: the one place ingest, pipeline and profiles ask."""

    module: str  # imported only when the converter runs
    inputs: tuple[str, ...]  # model kinds (edgekit.ingest.Model.kind) it converts
    precisions: tuple[str, ...]
    extra: str  # pip extra that installs its toolchain
    options: type[_Options]
    float_fallback: bool = False  # ops outside the target's list may stay float (allow_float_fallback)
    inputs_hint: str = ""  # what to do with a model kind it does not take


CONVERTERS: dict[str, ConverterInfo] = {
    "tensorrt": ConverterInfo("edgekit.converters.tensorrt", (*TORCH_INPUTS, "onnx"), ("fp32", "fp16", "int8"),
                              "jetson", TensorRTOptions),
    "tflite": ConverterInfo("edgekit.converters.tflite", (*TORCH_INPUTS, "keras", "saved_model"),
                            ("fp32", "fp16", "int8-dynamic", "int8"), "android", TFLiteOptions, float_fallback=True,
                            inputs_hint="export the torch model with torch.export.save"),
    "coreml": ConverterInfo("edgekit.converters.coreml", TORCH_INPUTS,
                            ("fp32", "fp16", "int8-weight", "int6-weight", "int4-weight", "prune-50", "int8"), "ios",
                            CoreMLOptions, inputs_hint="give the .pt2 / TorchScript / pkg.module:factory the model "
                            "came from (coremltools dropped its ONNX frontend)"),
    "hls4ml": ConverterInfo("edgekit.converters.hls4ml", (*TORCH_INPUTS, "onnx"), ("int8", "int4"), "fpga",
                            Hls4mlOptions),
}
# name -> module path (lazily imported)
REGISTRY: dict[str, str] = {name: info.module for name, info in CONVERTERS.items()}


def converter_info(name: str) -> ConverterInfo:
    if name not in CONVERTERS:
        raise ProfileError(f"unknown converter {name!r}; registered: {', '.join(sorted(CONVERTERS))}")
    return CONVERTERS[name]


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
    step: Callable[[str, str], None] = lambda name, msg: None  # progress of a long sub-step: "start", "3/16", "1.2 s"
    # what a converter made once and reuses in this job's rebuilds (mixed precision), e.g. 16x8's calibration ranges
    cache: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def substep(self, name: str) -> Iterator[None]:
        """A long part of the conversion (calibration, compilation), shown as a sub-step of the convert stage."""
        self.step(name, "start")
        t0 = time.perf_counter()
        yield
        self.step(name, f"{time.perf_counter() - t0:.2f} s")


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

    from edgekit.fsutil import data_dir

    name = f"edgekit_firmware_{runner}_{module}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, data_dir("firmware") / runner / f"{module}.py")
        mod = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]


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
    return "node names, comma-separated"


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
    module = importlib.import_module(converter_info(name).module)
    return module.CONVERTER
