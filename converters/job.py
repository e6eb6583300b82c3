"""What a converter is given and what it gives back: the job, the artifact, the host runner, the protocol."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from edgekit.data import Dataset
    from edgekit.ingest import Model
    from edgekit.profiles import Board, Target

# the INT8 build's default time budget with its mixed-precision search: a build a user waits for, not a batch job.
# The search and its rebuilds get what the first build and its verification left of it.
SEARCH_BUDGET_S = 300.0


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
    opset: int | None = None  # --opset; None: the target's
    output_kinds: dict[str, str] = field(default_factory=dict)  # output name -> kind (class, regression, ...)
    search_budget_s: float = SEARCH_BUDGET_S  # wall time the INT8 build may take with its search (--search-budget)
    started: float = field(default_factory=time.perf_counter)  # when this job's build began (perf_counter)
    allow_slower_int8: bool = False  # an INT8 build slower than float on the board's kernels may pass (edgekit.speed)
    durations: dict[str, float] = field(default_factory=dict)  # substep name -> seconds, summed over its runs

    @contextmanager
    def substep(self, name: str) -> Iterator[None]:
        """A long part of the conversion (calibration, compilation), shown as a sub-step of the convert stage."""
        self.step(name, "start")
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        self.durations[name] = self.durations.get(name, 0.0) + dt
        self.step(name, f"{dt:.2f} s")


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

    def versions(self) -> dict[str, str]: ...  # its toolchain's versions, for the manifest


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
