"""Core ML's ``--option key=value`` model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from edgekit.converters.options import ConverterOptions, split_names


class CoreMLOptions(ConverterOptions):
    weight_threshold: int | None = Field(None, ge=0, description="weights with fewer elements stay fp16")
    fp32_ops: dict[str, str] | None = Field(
        None, description="ML program op names kept fp32 in a W8A8 or fp16 build, each with the reason, as the "
        "first build measured them (mixed precision's rebuilds write these, so every rebuild keeps the same ops "
        "fp32 instead of measuring again)")
    calibration: Literal["auto", "histogram", "minmax"] = Field(
        "auto", description="int8 (W8A8) activation observer: auto (each is tried and the one whose program is "
        "closest to float on calibration samples wins), histogram or minmax")
    keep_float_nodes: list[str] = Field(
        default_factory=list, description="int8 (W8A8): torch.export node names left fp16 (no int8 quantize on "
        "their input, fp16 weights); mixed precision's rebuilds write these")
    _names = field_validator("keep_float_nodes", mode="before")(lambda cls, v: split_names(v))
