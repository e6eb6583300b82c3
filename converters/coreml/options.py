"""Core ML's ``--option key=value`` model."""

from __future__ import annotations

from pydantic import Field

from edgekit.converters.options import ConverterOptions


class CoreMLOptions(ConverterOptions):
    weight_threshold: int | None = Field(None, ge=0, description="weights with fewer elements stay fp16")
    fp32_ops: dict[str, str] | None = Field(
        None, description="ML program op names kept fp32 in a W8A8 or fp16 build, each with the reason, as the "
        "first build measured them (mixed precision's rebuilds write these, so every rebuild keeps the same ops "
        "fp32 instead of measuring again)")
