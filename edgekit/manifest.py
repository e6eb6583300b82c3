"""The build manifest: one typed record (pydantic) that the pipeline writes and bundle, flash, smoke,
results and calibrate read.

``manifest.json`` is this model's JSON; the on-board runners read the same file as plain JSON
(numpy only). Unknown or missing fields are an error naming the field (``extra="forbid"``).
``edgekit manifest-schema`` prints the JSON Schema. Sections whose content belongs to one stage
(the converter's ``artifact`` meta, ``analysis``, ``verification``, the planner's ``plan``) are
typed by that stage and kept as JSON objects here.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SCHEMA_VERSION = 2
SAFE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"
PYTHON = r"^(/[A-Za-z0-9._/+-]+/)?python[0-9.]*$"
MANIFEST = "manifest.json"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileEntry(_Record):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0)


class TensorIO(_Record):
    name: str
    shape: list[int]
    dtype: str
    layout: str | None = None
    # --batch-axis: the axis holding the batch where it is not 0 ("none": the tensor has no batch axis)
    batch_axis: int | Literal["none"] | None = None


class GoldenTensor(_Record):
    name: str
    key: str
    shape: list[int]
    dtype: str
    kind: str | None = None  # outputs: class | regression | mask | index | detection | detection_cf | ctc (the board judges it too)
    # the axis of the model's own tensor that holds the batch (1 for a time-major [T, N, C] recogniser or a
    # recurrent state [layers, N, H]; "none": no batch axis, one sample per run); the golden array has the samples
    # first: the board moves an input's to this axis and merges its runs' outputs on it (absent: 0)
    batch_axis: Annotated[int, Field(ge=0, le=8)] | Literal["none"] | None = None
    runtime_name: str | None = None  # the name in the artifact where its format renamed it (Core ML: x.1 -> x_1)


class Golden(_Record):
    file: str
    samples: int = Field(ge=1)
    source: str
    inputs: list[GoldenTensor]
    outputs: list[GoldenTensor]
    selection: dict[str, Any] | None = None  # seed, source, stratified, indices, held_out_of_calibration


class HostInfo(_Record):
    platform: str
    python: str


class BoardRef(_Record):
    id: str = Field(min_length=1)
    description: str = ""
    default_power_mode: str | None = None
    profile: dict[str, Any] = Field(default_factory=dict)


class SourceModel(_Record):
    path: str
    kind: str
    sha256: str
    # an ONNX file as edgekit prepared it (edgekit.onnx_bridge): the steps, the inputs folded as constants (the
    # artifact has no such inputs), and the bridge that rebuilt it in torch for a torch-only converter
    prepared: list[str] | None = None
    consts: dict[str, Any] | None = None
    bridge: str | None = None
    finetuned_from: dict[str, Any] | None = None  # edgekit finetune's record: the float model (path, sha256), recipe


class CalibrationRecord(_Record):
    source: str
    random: bool
    samples: int
    sha256: str | None
    used_for: str


class CarryPair(_Record):
    output: str
    input: str


class CarryRecord(_Record):
    """--carry: the outputs that feed inputs on the next chunk; data files are sequences of chunks in order."""

    pairs: list[CarryPair] = Field(min_length=1)
    sequence_length: int | None = Field(default=None, ge=1)  # chunks per sequence; None: each file is one
    states: str  # where the states the calibration and golden chunks take come from


class BudgetsRecord(_Record):
    """The board's budgets as the plan and the smoke test use them: ``ram_mb`` is the whole process (peak RSS),
    ``runtime_overhead_mb`` plus the model's share of the board's RAM."""

    latency_ms: float | None = None
    power_w: float | None = None
    ram_mb: float | None = None
    runtime_overhead_mb: float | None = None
    storage_mb: float | None = None
    energy_mj: float | None = None


class RunnerSpec(_Record):
    entry: str = "run.py"
    files: list[str] = Field(default_factory=list)
    python: str | None = Field(default=None, pattern=PYTHON)


class Manifest(_Record):
    """``manifest.json`` of a build folder and of its bundle."""

    schema_version: Literal[2] = SCHEMA_VERSION
    name: str = Field(pattern=SAFE_NAME, description="one plain folder name: the bundle's folder on the board")
    edgekit_version: str
    created_utc: str
    host: HostInfo
    target: str
    format: str
    precision: str
    board: BoardRef
    source_model: SourceModel
    inputs: list[TensorIO]
    outputs: list[TensorIO]
    calibration: CalibrationRecord | None = None
    carry: CarryRecord | None = None
    artifact: dict[str, Any] = Field(description="primary (file or folder), format, and the converter's own meta")
    toolchain: dict[str, Any]
    budgets: BudgetsRecord
    golden: Golden
    tolerance: dict[str, bool | float | None]  # bool: max_error_decides
    analysis: dict[str, Any]
    verification: dict[str, Any]
    runner: RunnerSpec = Field(default_factory=RunnerSpec)
    timings_s: dict[str, float] = Field(default_factory=dict)
    plan: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    files: dict[str, FileEntry] = Field(min_length=1)

    @field_validator("files")
    @classmethod
    def _inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        for rel in files:
            if not inside_name(rel):
                raise ValueError(f"file {rel!r} is not a plain relative path inside the bundle")
            if rel == MANIFEST:
                raise ValueError("lists the manifest itself")
        return files

    @model_validator(mode="after")
    def _entry(self) -> Manifest:
        if not inside_name(self.runner.entry) or self.runner.entry not in self.files:
            raise ValueError(f"runner.entry {self.runner.entry[:60]!r} is not a file of the bundle")
        if not isinstance(self.artifact.get("primary"), str):
            raise ValueError("artifact.primary is missing")
        return self

    @property
    def verification_passed(self) -> bool:
        """The one verdict recorded: passed, no failure, every output check passed."""
        v = self.verification
        outs = v.get("outputs") if isinstance(v.get("outputs"), list) else []
        return v.get("passed") is True and not v.get("failures") and all(
            isinstance(o, dict) and o.get("passed") is True for o in outs)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def inside_name(rel: str) -> bool:
    """A relative POSIX path that stays inside its folder: no absolute path, drive, backslash or '..'."""
    if not rel or rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel) or "\\" in rel or "\0" in rel:
        return False
    return ".." not in rel.split("/")


def validation_message(exc: ValidationError) -> str:
    """The first problem of a manifest, naming the field (``files.run.py.sha256``)."""
    e = exc.errors()[0]
    field = ".".join(str(x) for x in e["loc"]) or "(manifest)"
    kind = e["type"]
    if kind == "value_error":
        msg = e["msg"].removeprefix("Value error, ")
        return f"manifest: {msg}" if field == "(manifest)" else f"manifest field {field!r}: {msg}"
    if kind == "missing":
        return f"manifest field {field!r} is missing"
    if kind == "extra_forbidden":
        return f"manifest field {field!r} is not an edgekit manifest field"
    if kind == "string_pattern_mismatch":
        want = {"name": "must be one plain folder name (letters, digits, . _ + -)",
                "runner.python": "must name a python interpreter (python3, /usr/bin/python3.8, ...)"}
        return f"manifest field {field!r} is {str(e.get('input'))[:60]!r}; it " + want.get(
            field, "is not a sha256 hex digest" if field.endswith("sha256") else f"must match {e['ctx']['pattern']}")
    return f"manifest field {field!r}: {e['msg']}"


def schema() -> dict[str, Any]:
    """The JSON Schema of ``manifest.json`` (``edgekit manifest-schema``)."""
    return Manifest.model_json_schema()
