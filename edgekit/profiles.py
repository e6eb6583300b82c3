"""Board and target profiles: TOML files validated by pydantic (``extra="forbid"``).

``boards/<vendor>/<board>.toml`` describe one board (memory, storage, compute per
precision and power mode, power, default budgets); ``targets/<name>.toml`` describe one
output format (converter, precisions, supported ops, tolerances, runner). Units live in
field names. Values are checked, not only types: a Jetson whose INT8 throughput is
below its FP16 throughput, or whose budget exceeds its top power mode, does not load.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgekit.errors import ProfileError
from edgekit.fsutil import data_dir  # noqa: F401 - where profiles are found; re-exported

# int6-weight (6-bit weights, e.g. Core ML k-means palettization) and prune-50 (50 % magnitude
# sparsity, fp16 values + 1-bit mask) are weight-only formats added for the iOS target.
# int8-dynamic: int8 weights, activations quantized at run time inside the kernels (TFLite
# dynamic-range quantization; Android target).
# int4: 4-bit weights AND activations (FPGA fabric, power-of-two scales; FPGA target).
Precision = Literal[
    "fp32", "fp16", "int8", "int8-weight", "int4-weight", "int6-weight", "prune-50", "int8-dynamic", "int4",
]
PRECISION_ORDER: tuple[str, ...] = (
    "fp32", "fp16", "int8-weight", "int8-dynamic", "int8", "int6-weight", "int4-weight", "prune-50", "int4",
)


# op classes with their own efficiency in the cost model (edgekit.analyze.LayerStats.op_class); dense
# convolution ("conv") is the reference the precision's efficiency describes
OpClass = Literal["dwconv", "gemm"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True, allow_inf_nan=False)


class PowerMode(_Strict):
    power_w: float = Field(gt=0, description="module power in this mode (W)")
    peak_tops: dict[Precision, float] = Field(
        description="dense peak throughput per precision, tera-ops/s (1 MAC = 2 ops); "
        "a precision absent here is not offered on the board"
    )
    gpu_clock_mhz: float | None = Field(default=None, gt=0)

    @field_validator("peak_tops")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("peak_tops needs at least one precision")
        for k, x in v.items():
            if x <= 0:
                raise ValueError(f"peak_tops.{k} must be > 0 (got {x})")
        return v


class BoardBudgets(_Strict):
    model_ram_share: float = Field(gt=0, le=1, description="share of board RAM the model may use")
    latency_ms: float = Field(gt=0)
    power_w: float = Field(gt=0)
    storage_mb: float | None = Field(default=None, gt=0)
    energy_mj: float | None = Field(default=None, gt=0)
    accuracy_drop_points: float = Field(default=1.0, ge=0, le=100)


class FpgaResources(_Strict):
    """Programmable-logic resources of an FPGA board (datasheet counts), for the fabric estimate."""

    part: str = Field(description="Xilinx/AMD part number given to Vivado/Vitis HLS")
    hls4ml_board: str | None = Field(default=None, description="hls4ml VivadoAccelerator board name; None = bare IP")
    lut: int = Field(gt=0)
    ff: int = Field(gt=0)
    bram36: int = Field(gt=0, description="36 Kib block RAMs")
    uram: int = Field(default=0, ge=0, description="288 Kib UltraRAMs (UltraScale+ only)")
    dsp: int = Field(gt=0, description="DSP48 slices")
    fabric_clock_mhz: float = Field(gt=0, description="clock the overlay is built for")
    ps_ddr_mb: int = Field(gt=0, description="DDR attached to the processing system (DMA buffers live there)")

    @model_validator(mode="after")
    def _check(self) -> FpgaResources:
        if self.ff < self.lut:
            raise ValueError("ff below lut: every 7-series / UltraScale+ slice has 2 FF per LUT")
        return self


class Board(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    vendor: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str
    targets: list[str] = Field(min_length=1)
    ram_mb: int = Field(gt=0)
    storage_mb: int = Field(gt=0)
    memory_bandwidth_gbps: float = Field(gt=0)
    runtime_overhead_mb: float = Field(ge=0, description="RAM taken by the runtime before the model loads")
    default_power_mode: str
    power_modes: dict[str, PowerMode] = Field(min_length=1)
    budgets: BoardBudgets
    efficiency: dict[Precision, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict,
        description="share of peak throughput reached in practice (cost model); recalibrated from measurements",
    )
    launch_overhead_us: float = Field(default=0, ge=0, description="per-layer launch overhead (cost model)")
    # a batch-1 GEMM is memory-bound: its compute share matters little and may come out above 1
    class_efficiency: dict[OpClass, Annotated[float, Field(gt=0, le=4)]] = Field(
        default_factory=dict,
        description="throughput of an op class relative to dense convolution at the same precision (cost model): "
        "depthwise convolutions and batch-1 GEMMs reach a smaller share of peak; absent = 1",
    )
    activation_passes: dict[Precision, Annotated[float, Field(ge=0, le=20)]] = Field(
        default_factory=dict,
        description="extra passes the runtime makes over each layer's output at that precision (cost model): "
        "onnxruntime on a CPU runs int8 as Quantize/DequantizeLinear around layers and fp16 with casts and layout "
        "reorders; a runtime that fuses them (TensorRT, LiteRT) makes none; absent = 0",
    )
    detect: Literal["host-cpu"] | None = Field(
        default=None, description="host-cpu: peak_tops and ram_mb are read off this machine (edgekit.hostcpu) "
        "when the profile loads; the TOML's figures stand where /proc cannot be read")
    sparsity_2_4: bool = Field(default=False, description="2:4 structured sparsity runs at 2x tensor rate (Ampere+)")
    min_ios: int | None = Field(default=None, ge=13, le=30, description="oldest iOS/iPadOS the app supports on this "
                                "device: the Core ML deployment target (Apple boards only)")
    fpga: FpgaResources | None = Field(default=None, description="programmable logic (FPGA boards only)")
    native_precision: Precision | None = Field(
        default=None, description="the precision the board's accelerator computes in (the Neural Engine: fp16): "
        "the planner ranks it as the least compressed, as less compressed formats gain nothing there (fp32 leaves "
        "the accelerator); --precision still takes them")
    int16_activations: Literal["reference", "native"] = Field(
        default="reference", description="how the board runs int8 weights with 16-bit activations (TFLite 16x8): "
        "reference = LiteRT's portable CPU kernels (XNNPACK, GPU and NNAPI take none; many times slower than int8), "
        "so the host's timing judges a 16x8 build; native = an NPU that computes w8a16, where the host's timing does "
        "not stand for the board")
    notes: list[str] = Field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.vendor}/{self.name}"

    @property
    def precisions(self) -> list[str]:
        found: set[str] = set()
        for mode in self.power_modes.values():
            found.update(mode.peak_tops)
        return [p for p in PRECISION_ORDER if p in found]

    @model_validator(mode="after")
    def _check_values(self) -> Board:
        if self.default_power_mode not in self.power_modes:
            raise ValueError(
                f"default_power_mode {self.default_power_mode!r} is not one of {sorted(self.power_modes)}"
            )
        top = max(m.power_w for m in self.power_modes.values())
        if self.budgets.power_w > top * 1.0001:
            raise ValueError(f"budgets.power_w {self.budgets.power_w} exceeds the top power mode ({top} W)")
        low = min(m.power_w for m in self.power_modes.values())
        if self.budgets.power_w < low * 0.9999:
            raise ValueError(
                f"budgets.power_w {self.budgets.power_w} is below every power mode (lowest {low} W): "
                "no build could meet it; budget at least the lowest mode's power"
            )
        if self.native_precision is not None and self.native_precision not in self.precisions:
            raise ValueError(f"native_precision {self.native_precision} is not in the power modes' peak_tops")
        if self.runtime_overhead_mb >= self.ram_mb:
            raise ValueError("runtime_overhead_mb must be below ram_mb")
        keys = {frozenset(m.peak_tops) for m in self.power_modes.values()}
        if len(keys) > 1:
            raise ValueError("every power mode must list the same precisions in peak_tops")
        for name, m in self.power_modes.items():
            t = m.peak_tops
            # lower precision never has less peak throughput on the same silicon
            if "fp16" in t and "fp32" in t and t["fp16"] < t["fp32"]:
                raise ValueError(f"power_modes.{name}: fp16 peak below fp32 peak")
            if "int8" in t and "fp16" in t and t["int8"] < t["fp16"]:
                raise ValueError(f"power_modes.{name}: int8 peak below fp16 peak")
        return self


class Tolerance(_Strict):
    """Per precision; each output is judged by its kind (firmware/common/edgekit_smoke.check_output)."""

    max_rel_error: float = Field(gt=0, description="max |converted - float| / max |float| over the golden set")
    abs_floor: float = Field(default=0.0, ge=0, description="absolute error always allowed (tiny-range outputs)")
    min_top1_agreement: float = Field(ge=0, le=1, description="class outputs: top-1 agreement with float")
    min_snr_db: float | None = Field(default=None, description="regression outputs: SNR against float; None = reported only")
    min_iou: float = Field(default=0.9, ge=0, le=1, description="mask outputs: IoU at threshold 0.5")
    min_exact: float = Field(default=0.99, ge=0, le=1, description="index outputs: share of exact matches")
    max_accuracy_drop_points: float = Field(ge=0, le=100, description="with --eval: float minus converted accuracy")
    max_error_decides: bool = Field(default=False, description="class / regression outputs: max_rel_error fails an "
                                    "output even where its task metric (min_top1_agreement, min_snr_db) passes; "
                                    "default: it is then a warning naming the worst sample")


class Target(_Strict):
    name: str
    description: str
    format: str
    converter: str
    extra: str = Field(description="pip extra that installs this target's toolchain")
    precisions: list[Precision] = Field(min_length=1)
    default_precision: Precision
    host_runtime: str
    runner: str = Field(description="folder under firmware/ copied into the bundle")
    default_board: str | None = None
    opset: int | None = Field(default=None, ge=13)
    supported_ops: list[str] | None = Field(default=None, description="op types the target runs; None = not checked")
    ops_precisions: list[Precision] | None = Field(
        default=None, description="the precisions supported_ops / supported_tflite_ops hold for (e.g. a list of "
        "int8 kernels); None = every precision")
    supported_tflite_ops: list[str] | None = Field(
        default=None, description="TFLite builtin ops the target runs, checked on the float .tflite of Keras / "
        "SavedModel input (analyzed as TFLite, not ONNX); None = not checked")
    rewrites: list[str] = Field(
        default_factory=list, description="ONNX ops outside supported_ops that the converter rewrites into ops the "
        "target runs, where their pattern allows (edgekit.analyze._rewritable: Pow 2 -> Mul, Div by a Sqrt -> "
        "Rsqrt + Mul, Div by a constant -> Mul)")
    missing_ops: dict[str, str] = Field(
        default_factory=dict, description="op -> why the target's own toolchain cannot build it (a true limit of "
        "the target today, said so in the refusal)")
    converter_gaps: dict[str, str] = Field(
        default_factory=dict, description="op -> why edgekit refuses it although the target's runtime has it (a "
        "limitation of edgekit's converter, said so in the refusal)")
    kept_precision: Literal["fp32", "fp16"] = Field(
        default="fp32", description="the precision the board's kernels run a layer kept out of INT8 at (mixed "
        "precision): TensorRT builds --int8 --fp16 (fp16), Core ML computes float in fp16, LiteRT runs a layer "
        "between DEQUANTIZE and QUANTIZE on fp32 kernels; the cost model prices kept layers at it")
    tolerances: dict[Precision, Tolerance]

    @model_validator(mode="after")
    def _check(self) -> Target:
        if self.default_precision not in self.precisions:
            raise ValueError(f"default_precision {self.default_precision!r} not in precisions")
        missing = [p for p in self.precisions if p not in self.tolerances]
        if missing:
            raise ValueError(f"tolerances missing for {missing}")
        return self


# ---------------------------------------------------------------- locating data


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc}); fix the file") from None


def _fmt_validation(path: Path | str, exc: ValidationError, what: str = "profile") -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(file)"
        parts.append(f"{loc}: {err['msg']}")
    return f"{path}: invalid {what}: " + "; ".join(parts)


def board_files() -> dict[str, Path]:
    root = data_dir("boards")
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(root.glob("*/*.toml"))}


def target_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(data_dir("targets").glob("*.toml"))}


def parse_overrides(items: list[str] | None, flag: str = "--set", example: str = "ram_mb=4096") -> dict[str, Any]:
    """``key=value`` strings to a dict; values are parsed as TOML (``8``, ``1.5``, ``"x"``, ``[..]``)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ProfileError(f"{flag} {item!r}: expected key=value, e.g. {flag} {example}")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # bare string
        out[key.strip()] = value
    return out


def _apply(data: dict[str, Any], overrides: dict[str, Any], what: str) -> dict[str, Any]:
    for dotted, value in overrides.items():
        node = data
        keys = dotted.split(".")
        for k in keys[:-1]:
            nxt = node.get(k)
            if not isinstance(nxt, dict):
                raise ProfileError(f"--set {dotted}: {what} has no table {k!r}")
            node = nxt
        node[keys[-1]] = value
    return data


def resolve_board_name(name: str) -> str:
    files = board_files()
    if name in files:
        return name
    matches = [k for k in files if k.split("/", 1)[1] == name]
    if len(matches) == 1:
        return matches[0]
    raise ProfileError(f"unknown board {name!r}; known boards: {', '.join(files)} (see `edgekit boards`)")


def load_board(name: str, overrides: list[str] | dict[str, Any] | None = None) -> Board:
    key = resolve_board_name(name)
    path = board_files()[key]
    data = _read_toml(path)
    ov = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    if data.get("detect") == "host-cpu":
        data = _detect_host(data)
    data = _apply(data, ov, f"board {key}")
    try:
        board = Board.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_fmt_validation(path if not ov else f"{path} with --set {ov}", exc)) from None
    if board.id != key:
        raise ProfileError(f"{path}: vendor/name say {board.id!r} but the file is {key!r}")
    return board


def _detect_host(data: dict[str, Any]) -> dict[str, Any]:
    """Fill the host board's peak and RAM from this machine (see edgekit.hostcpu); where its CPU
    cannot be read (no /proc/cpuinfo), the TOML's figures stand."""
    from edgekit.hostcpu import detect

    cpu = detect()
    if cpu is None:
        return data
    peak = cpu.peak_tops()
    for mode in data.get("power_modes", {}).values():
        mode["peak_tops"] = {k: peak[k] for k in mode.get("peak_tops", peak) if k in peak}
    if cpu.ram_mb:
        data["ram_mb"] = cpu.ram_mb
    data["description"] = f"{data.get('description', 'this machine')}; detected: {cpu.describe()}"
    return data


def load_target(name: str) -> Target:
    files = target_files()
    if name not in files:
        raise ProfileError(f"unknown target {name!r}; known targets: {', '.join(files)}")
    path = files[name]
    try:
        target = Target.model_validate(_read_toml(path))
    except ValidationError as exc:
        raise ProfileError(_fmt_validation(path, exc)) from None
    if target.name != name:
        raise ProfileError(f"{path}: name says {target.name!r} but the file is {name!r}")
    check_against_registry(target, path)
    return target


def override_tolerances(target: Target, changes: dict[str, Any]) -> Target:
    """``target`` with ``changes`` applied to the tolerance of every precision, checked like the profile."""
    try:
        tols = {p: Tolerance.model_validate({**t.model_dump(), **changes}) for p, t in target.tolerances.items()}
    except ValidationError as exc:
        raise ProfileError(_fmt_validation(f"target {target.name} with tolerance {changes}", exc)) from None
    return target.model_copy(update={"tolerances": tols})


def check_against_registry(target: Target, path: Path | str) -> None:
    """A target profile agrees with its converter's registry entry: the converter exists, offers every
    precision the target lists, and is installed by the target's extra."""
    from edgekit.converters import CONVERTERS

    info = CONVERTERS.get(target.converter)
    if info is None:
        raise ProfileError(f"{path}: converter {target.converter!r} is not registered "
                           f"(registered: {', '.join(sorted(CONVERTERS))})")
    missing = [p for p in target.precisions if p not in info.precisions]
    if missing:
        raise ProfileError(f"{path}: converter {target.converter!r} has no precision {', '.join(missing)} "
                           f"(it offers {', '.join(info.precisions)})")
    if target.extra != info.extra:
        raise ProfileError(f"{path}: extra {target.extra!r}, but converter {target.converter!r} is installed by "
                           f"edgekit[{info.extra}]")


@cache
def _all_boards() -> tuple[Board, ...]:
    return tuple(load_board(k) for k in board_files())


def list_boards(target: str | None = None) -> list[Board]:
    return [b for b in _all_boards() if target is None or target in b.targets]


def list_targets() -> list[Target]:
    return [load_target(k) for k in target_files()]


def default_board(target: str) -> Board:
    named = load_target(target).default_board
    if named:
        return load_board(named)
    boards = list_boards(target)
    if not boards:
        raise ProfileError(f"no shipped board supports target {target!r}; give one with --board")
    return boards[0]
