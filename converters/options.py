"""The base of every converter's ``--option key=value`` model: unknown keys and bad values are refused, never
dropped. Each converter package declares its own model beside its converter (``<package>/options.py``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

class ConverterOptions(BaseModel):
    """``--option key=value`` of a converter: unknown keys and bad values are refused, never dropped."""

    model_config = ConfigDict(extra="forbid")
    allow_float_fallback: bool = Field(False, description="build even where ops fall outside the target's list")

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) and v.strip().lower() in CHOICE_WORDS else v


class TensorRTOptions(ConverterOptions):
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
    _names = field_validator("keep_float_nodes", mode="before")(lambda cls, v: split_names(v))


class TFLiteOptions(ConverterOptions):
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
        lambda cls, v: split_names(v))


class CoreMLOptions(ConverterOptions):
    weight_threshold: int | None = Field(None, ge=0, description="weights with fewer elements stay fp16")


class Hls4mlOptions(ConverterOptions):
    fpga_scales: Literal["po2", "float"] = Field("po2", description="power-of-two or float quantizer scales")


def split_names(v: Any) -> Any:
    return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v


CHOICE_WORDS = {"int8", "float", "nchw", "nhwc", "po2", "true", "false", "yes", "no", "on", "off"}
