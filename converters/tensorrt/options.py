"""``--option`` of the tensorrt converter (jetson target)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from edgekit.converters.options import ConverterOptions, split_names


class TensorRTOptions(ConverterOptions):
    keep_float_nodes: list[str] = Field(default_factory=list, description="ONNX node names kept out of INT8")
    calibration: Literal["auto", "minmax", "percentile", "percentile-99.99", "entropy", "mse"] = Field(
        "auto", description="INT8 activation ranges: auto (default: each method is tried and the one whose model is "
        "closest to float on calibration samples wins), minmax (the observed range), percentile (clips |x| at the "
        "99.999th percentile), percentile-99.99, entropy (KL-optimal threshold, 2048 bins) or mse (the range of "
        "least rounding + clipping error over the histogram)")
    qdq: Literal["tensorrt", "all"] = Field(
        "tensorrt", description="INT8 Q/DQ placement: tensorrt (default; TensorRT's guidance, as NVIDIA ModelOpt: the "
        "inputs of convolutions, GEMM/MatMul and average pooling; the rest runs fp16) or all (onnxruntime's default: "
        "every op it quantizes, inputs and outputs)")
    bias_correction: Literal["auto", "on", "off"] = Field(
        "off", description="INT8: take the mean shift int8 puts in each quantized conv / GEMM output channel out of "
        "its bias (measured on calibration data, layer by layer): off (default), auto (applied where the model gets "
        "closer to float on calibration samples) or on")
    equalize: Literal["auto", "on", "off"] = Field(
        "off", description="INT8: make the channels of each tensor a convolution feeds a depthwise convolution "
        "(directly or through a ReLU) span the same range, the scales moved into the two layers' per-channel "
        "weights, so its per-tensor INT8 range serves every channel: off (default), auto (applied where the model "
        "gets closer to float on calibration samples) or on")
    student_ranges: Literal["on", "off"] = Field(
        "off", description="INT8 of a .pt2 that edgekit finetune wrote for jetson: on imposes the activation ranges "
        "its student trained with on the tensors that hold the same values, so the build computes what the student "
        "did, and checks it against the float model it was fine-tuned from; off (default) calibrates them from "
        "--calib")
    _names = field_validator("keep_float_nodes", mode="before")(lambda cls, v: split_names(v))
