"""The base of every converter's ``--option key=value`` model: unknown keys and bad values are refused, never
dropped. Each converter package declares its own model beside its converter (``<package>/options.py``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

class ConverterOptions(BaseModel):
    """``--option key=value`` of a converter: unknown keys and bad values are refused, never dropped."""

    model_config = ConfigDict(extra="forbid")
    allow_float_fallback: bool = Field(False, description="build even where ops fall outside the target's list")

    @field_validator("*", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) and v.strip().lower() in CHOICE_WORDS else v


def split_names(v: Any) -> Any:
    return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v


CHOICE_WORDS = {"int8", "float", "nchw", "nhwc", "po2", "true", "false", "yes", "no", "on", "off"}
