"""``--option`` of the hls4ml converter (fpga target)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgekit.converters.options import ConverterOptions


class Hls4mlOptions(ConverterOptions):
    fpga_scales: Literal["po2", "float"] = Field(
        "po2", description="power-of-two (default; the only scales hls4ml computes bit-exactly) or float quantizer "
        "scales")
