"""The android target's ``--option key=value`` model (pydantic only: the registry imports it when options are
checked) and what its options mean to a build: the pip extra of its toolchain, 16-bit activations, float LSTMs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from edgekit.converters.options import ConverterOptions, split_names
from edgekit.errors import ConversionError


EXTRA = "android"  # the pip extra that installs this target's toolchain


class TFLiteOptions(ConverterOptions):
    calibration: Literal["auto", "histogram", "minmax"] = Field(
        "auto", description="int8 activation observer: auto (each is tried and the one whose model is closest to "
        "float on calibration samples wins), histogram (HistogramObserver, L2-optimal range) or minmax")
    keep_float_nodes: list[str] = Field(default_factory=list, description="torch.export node names kept float")
    io: Literal["int8", "float"] = Field("int8", description="int8 builds: int8 or float32 input/output tensors")
    lstm: Literal["int8", "float"] = Field(
        "float", description="int8 builds: LSTMs kept float (litert-torch writes each out per step in fp32 between "
        "DEQUANTIZE and QUANTIZE, as the jetson and ios INT8 builds run them), or written out per time step in int8 "
        "(FULLY_CONNECTED / LOGISTIC / TANH / MUL / ADD: full integer, for a board whose NPU runs no float)")
    layout: Literal["nchw", "nhwc"] | None = Field(None, description="torch models: NHWC input (to_channel_last_io)")
    threads: int = Field(2, ge=1, le=256, description="host interpreter threads for verification")
    activations: Literal["int8", "int16"] = Field(
        "int8", description="int8 builds: int8 activations, or int16 (TFLite's 16x8 mode by ai-edge-quantizer: int8 "
        "weights, int16 activations and I/O; closer to float, slower: no XNNPACK/GPU/NNAPI kernels). Unset, mixed "
        "precision tries int16 last where an int8 build fails verification")
    keep_float_tensors: list[str] = Field(
        default_factory=list, description="with activations=int16: ops kept float in the 16x8 model, named by their "
        "output tensor in the fp32 .tflite (mixed precision's 16x8 layer search writes these)")
    hard_activations: Literal["xnnpack", "fused"] = Field(
        "xnnpack", description="int8 builds: HardSwish / HardSigmoid written out as ADD (RELU6 fused) and MUL, which "
        "XNNPACK's int8 kernels run, or fused (one HARD_SWISH / RELU_0_TO_1: one rounding, closer to float, but "
        "TFLite's reference kernels run it outside XNNPACK: slower)")
    keras: Literal["tflite", "onnx"] = Field(
        "tflite", description="Keras / SavedModel input: tflite (TensorFlow's TFLiteConverter quantizes the whole "
        "model) or onnx (tf2onnx, then the PT2E path of ONNX and torch input: INT8 mixed precision can keep "
        "chosen layers float there)")
    _names = field_validator("keep_float_nodes", "keep_float_tensors", mode="before")(
        lambda cls, v: split_names(v))


def wide_activations(job: Any) -> bool:
    """``--option activations=int16`` (TFLite's 16x8 mode); any other value than int8 / int16 is refused."""
    a = str(job.options.get("activations") or "int8").lower()
    if a not in ("int8", "int16"):
        raise ConversionError(f"--option activations={a}: choose int8 (default) or int16 (16-bit activations, int8 "
                              "weights: TFLite's 16x8 mode)")
    return a == "int16"


def lstm_float(job: Any) -> bool:
    """Every LSTM of an int8 build stays float: the default; ``--option lstm=int8`` writes them out in int8.
    (The zoo's three LSTM models, ddddocr-ocr, ppocr-rec and openWakeWord's hey-mycroft, each failed verification
    with int8 LSTMs, and that first build took 100-130 s of their android INT8 builds before the float one.)"""
    return str(job.options.get("lstm") or "float").lower() == "float"


def fused_hard(job: Any) -> bool:
    """``--option hard_activations=fused``: HardSwish / HardSigmoid as one int8 op each (reference kernels)."""
    return str(job.options.get("hard_activations") or "xnnpack").lower() == "fused"
