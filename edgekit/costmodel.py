"""The cost model: RAM, storage, latency and energy of one model on one board, before building.

Everything the planner knows about a board's speed is in this module. The inputs are the
per-layer analysis (:class:`edgekit.analyze.ModelStats`) and the board profile
(:class:`edgekit.profiles.Board`); nothing is run.

**Memory** (RAM, MB) = weights at each layer's precision (sparse encoding where the
candidate uses 2:4 sparsity) + peak live activations at the activation precision
(liveness walk from ``analyze``) + the board's ``runtime_overhead_mb``.

**Storage** (MB) = the weights as stored (same encoding as in RAM).

**Latency** (ms) = sum over layers of
``max(compute, memory) + launch x (1 + passes) + passes x output bytes / bandwidth`` where
``compute = 2 * MACs / (peak_tops[precision] at the power mode * efficiency[precision] * class_efficiency[class])``
and ``memory = (weight bytes + input and output activation bytes) / memory_bandwidth_gbps``.
The op class (:attr:`edgekit.analyze.LayerStats.op_class`) is ``conv`` (dense convolution, the reference: factor 1),
``dwconv`` (grouped / depthwise: few MACs per byte, far below peak on every runtime) or
``gemm`` (Gemm / MatMul / fully connected: at batch 1 a matrix-vector product, memory-bound).
``passes`` (``activation_passes[precision]``, default 0) are the extra elementwise kernels a
runtime runs over each layer's output at that precision: onnxruntime on a CPU executes an INT8
Q/DQ graph as QuantizeLinear / DequantizeLinear / Transpose around its integer kernels and an
fp16 graph with casts and layout reorders, each a launch plus a pass over the tensor; TensorRT
and LiteRT fuse them (0). Ops that runtimes fuse into the previous kernel (activations, folded
norms, reshapes) have no launch, memory or pass term of their own.
Weight-only precisions (int8-weight, int6-weight, int4-weight, prune-50) compute at the best
float rate the board has, unless its profile lists them in ``peak_tops``. 2:4 sparsity doubles the tensor rate of the layers it covers (Ampere sparse tensor
cores) and halves their stored weights plus 2 bits of index per kept value.

**Energy** (mJ) = power of the power mode (W) x latency (ms).

**FPGA boards** (a profile with an ``[fpga]`` table, int8 / int4): the layers run as hls4ml's dataflow pipeline,
not as kernels, so the latency is the fabric's own estimate (:func:`edgekit.fabric.plan_estimate`: the smallest
reuse factor whose DSP / BRAM36 / LUT / FF estimate stays under 80 % of the board, and the latency at the fabric
clock that reuse gives), and the share of the fabric taken is a budget of its own (``fabric_share``).

**Structured pruning** at ratio ``r`` removes that share of output channels from every
Conv/Gemm except the last (the classifier keeps its outputs): MACs and weights of a
layer scale by ``(1-r)`` for each of its pruned sides (input and output), activations by
``(1-r)``. This is the estimate; the built model is pruned by torch-pruning.

The efficiency factors (per precision and per op class), activation passes, launch overhead and
bandwidth start from the profile and are replaced by ``edgekit calibrate`` fits (see
:mod:`edgekit.calibrate`), which :func:`calibrated` applies. :func:`layer_terms` gives the
per-layer terms at efficiency 1, bandwidth factor 1 and no launch: the same arithmetic
:func:`estimate` uses, and what the fit scales.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgekit.analyze import WEIGHT_OPS, ModelStats
from edgekit.profiles import Board

MB = 1e6
DEFAULT_EFFICIENCY = 0.25  # for a precision the profile gives no factor for
# bytes per weight value, and per activation value, at each precision (unknown: fp32's)
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "int8": 1.0, "int8-weight": 1.0, "int8-dynamic": 1.0, "int6-weight": 0.75,
                "int4-weight": 0.5, "int4": 0.5, "prune-50": 0.5 * 2 + 1 / 8}  # prune-50: half fp16 + 1-bit mask
ACT_BYTES = {"fp32": 4.0, "fp16": 2.0, "int8": 1.0, "int8-weight": 2.0, "int8-dynamic": 4.0, "int6-weight": 2.0,
             "int4-weight": 2.0, "int4": 0.5, "prune-50": 2.0}
# weight-only formats: the layer computes in float (at the board's best float rate) unless the
# board lists the format in peak_tops itself
WEIGHT_ONLY = ("int8-weight", "int6-weight", "int4-weight", "prune-50")
FABRIC_BITS = {"int8": 8, "int4": 4}  # what the fpga target builds (weights and activations)
TENSOR_CORE_PRECISIONS = ("fp16", "int8", "int8-weight", "int4-weight")
# ops that runtimes fuse into the producing kernel (activations, folded norms) or run as
# metadata changes: no launch of their own
FUSED_OPS = frozenset({"Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu",
                       "BatchNormalization", "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Dropout"})


@dataclass(frozen=True)
class Candidate:
    """One way to build the model: precision x pruning x power mode."""

    precision: str
    power_mode: str
    prune_ratio: float = 0.0  # structured channel pruning
    sparsity: str | None = None  # "2:4" where the board supports it
    float_layers: tuple[str, ...] = ()  # layers kept at higher precision (sensitivity)
    kept_precision: str = "fp32"  # what the kept layers run at on the board's kernels (Target.kept_precision)

    @property
    def label(self) -> str:
        parts = [self.precision]
        if self.prune_ratio:
            parts.append(f"prune{int(round(self.prune_ratio * 100))}%")
        if self.sparsity:
            parts.append(self.sparsity)
        if self.float_layers:
            parts.append(f"{len(self.float_layers)} {self.kept_precision} layer(s)")
        parts.append(self.power_mode)
        return " / ".join(parts)


def latency_ms(compute_ms: Any, memory_ms: Any, launch_ms: Any, passes_ms: Any) -> float:
    """The one latency formula (floats, or numpy arrays over layers, summed): each layer is bound by compute
    or by memory traffic, whichever is slower, plus its kernel launches and its activation passes."""
    return float(np.sum(np.maximum(compute_ms, memory_ms) + launch_ms + passes_ms))


@dataclass
class LayerCost:
    name: str
    op: str
    precision: str
    weight_bytes: float
    macs: float
    compute_ms: float
    memory_ms: float
    launch_ms: float  # the layer's own launch plus those of its activation passes
    passes_ms: float = 0.0  # bytes moved by the runtime's extra passes over the output (Q/DQ, casts)
    op_class: str = "other"

    @property
    def latency_ms(self) -> float:
        return latency_ms(self.compute_ms, self.memory_ms, self.launch_ms, self.passes_ms)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


@dataclass
class Estimate:
    candidate: Candidate
    ram_mb: float
    storage_mb: float
    latency_ms: float
    energy_mj: float
    power_w: float
    weights_mb: float
    activations_mb: float
    runtime_overhead_mb: float
    layers: list[LayerCost] = field(default_factory=list)
    fabric: dict[str, Any] | None = None  # FPGA boards: fit and timing on the fabric (edgekit.fabric.plan_estimate)

    @property
    def fabric_share(self) -> float | None:
        """The share of the fabric's most used resource (DSP, BRAM36, LUT or FF) at the chosen reuse factor."""
        return None if self.fabric is None else float(self.fabric["share"])

    def to_json(self, layers: bool = False) -> dict[str, Any]:
        d = {
            "candidate": asdict(self.candidate) | {"label": self.candidate.label},
            **{k: round(v, 6) for k, v in asdict(self).items() if isinstance(v, float)},
        }
        if layers:
            d["layers"] = [asdict(lc) | {"latency_ms": lc.latency_ms, "bound": lc.bound} for lc in self.layers]
        if self.fabric is not None:
            d["fabric"] = {k: v for k, v in self.fabric.items() if k != "estimate"} | {
                k: self.fabric["estimate"][k] for k in ("dsp", "bram36", "lut", "ff", "utilization")}
        return d


def efficiency(board: Board, precision: str) -> float:
    if precision in board.efficiency:
        return board.efficiency[precision]
    if precision in WEIGHT_ONLY:
        return board.efficiency.get(_float_compute_precision(board), DEFAULT_EFFICIENCY)
    return DEFAULT_EFFICIENCY


def _float_compute_precision(board: Board) -> str:
    return "fp16" if "fp16" in board.precisions else "fp32"


def compute_precision(board: Board, precision: str) -> str:
    """The precision whose throughput a layer runs at (weight-only formats compute in float)."""
    if precision in board.precisions or precision not in WEIGHT_ONLY:
        return precision
    return _float_compute_precision(board)


def class_efficiency(board: Board, cls: str) -> float:
    return board.class_efficiency.get(cls, 1.0)


def _weight_layers(stats: ModelStats) -> list[int]:
    return [i for i, lay in enumerate(stats.layers) if lay.op in WEIGHT_OPS and lay.params > 0]


@dataclass
class LayerTerms:
    """One layer's cost at efficiency 1, class factor 1, bandwidth factor 1 and no launch overhead."""

    name: str
    op: str
    op_class: str
    precision: str
    macs: float
    weight_bytes: float
    compute_ms_eff1: float  # 2 MACs / peak
    memory_ms: float  # (weights + input and output activations) / bandwidth
    pass_ms: float  # output activation bytes / bandwidth: one extra pass over the output
    launches: int  # 1, or 0 for ops fused into the previous kernel


def layer_terms(stats: ModelStats, board: Board, cand: Candidate) -> list[LayerTerms]:
    mode = board.power_modes[cand.power_mode]
    r = cand.prune_ratio
    wl = _weight_layers(stats)
    first, last = (wl[0], wl[-1]) if wl else (-1, -1)
    bw = board.memory_bandwidth_gbps * 1e9  # bytes/s
    out: list[LayerTerms] = []
    prev_act = float(stats.input_bytes)
    for i, lay in enumerate(stats.layers):
        prec = cand.kept_precision if lay.name in cand.float_layers else cand.precision
        # pruning: inputs of every weight layer after the first are pruned, outputs of all but the last
        keep_in = (1 - r) if (lay.op in WEIGHT_OPS and i > first and i <= last) else 1.0
        keep_out = (1 - r) if (i < last) else 1.0
        is_w = lay.op in WEIGHT_OPS and lay.params > 0
        macs = lay.macs * keep_out * (keep_in if is_w else 1.0)
        params = lay.params * keep_out * (keep_in if is_w else 1.0)
        if is_w:
            wbytes = params * WEIGHT_BYTES.get(prec, 4.0)
            if cand.sparsity == "2:4" and prec in TENSOR_CORE_PRECISIONS:
                wbytes = wbytes / 2 + params / 2 * 2 / 8  # half the values + 2-bit index per kept value
        else:
            wbytes = params * (2.0 if prec == "fp16" else 4.0)
        act_scale = ACT_BYTES.get(prec, 4.0) / 4.0
        out_act = lay.activation_bytes * keep_out * act_scale
        cprec = compute_precision(board, prec)
        tops = mode.peak_tops.get(cprec) or mode.peak_tops.get("fp32") or max(mode.peak_tops.values())
        if cand.sparsity == "2:4" and is_w and prec in TENSOR_CORE_PRECISIONS:
            tops *= 2
        fused = lay.op in FUSED_OPS
        out.append(LayerTerms(
            name=lay.name, op=lay.op, op_class=lay.op_class, precision=prec, macs=macs, weight_bytes=wbytes,
            compute_ms_eff1=2 * macs / (tops * 1e12) * 1e3 if macs else 0.0,
            memory_ms=0.0 if fused else (wbytes + prev_act * act_scale + out_act) / bw * 1e3,
            pass_ms=0.0 if fused else out_act / bw * 1e3, launches=0 if fused else 1))
        prev_act = lay.activation_bytes * keep_out
    return out


def estimate(stats: ModelStats, board: Board, cand: Candidate) -> Estimate:
    """RAM, storage, latency and energy of ``stats`` built as ``cand`` on ``board``."""
    mode = board.power_modes[cand.power_mode]
    launch_ms = board.launch_overhead_us / 1e3
    layers: list[LayerCost] = []
    for t in layer_terms(stats, board, cand):
        eff = efficiency(board, t.precision) * class_efficiency(board, t.op_class)
        passes = board.activation_passes.get(t.precision, 0.0)
        layers.append(LayerCost(t.name, t.op, t.precision, t.weight_bytes, t.macs, t.compute_ms_eff1 / eff,
                                t.memory_ms, t.launches * launch_ms * (1 + passes), passes * t.pass_ms, t.op_class))
    total_w = sum(lc.weight_bytes for lc in layers)
    act_prec = ACT_BYTES.get(cand.precision, 4.0) / 4.0
    act_mb = stats.peak_activation_bytes * (1 - cand.prune_ratio if _weight_layers(stats) else 1.0) * act_prec / MB
    weights_mb = total_w / MB
    latency = sum(lc.latency_ms for lc in layers)
    fabric = None
    if board.fpga is not None and cand.precision in FABRIC_BITS:
        # the fabric: layers run as hls4ml's dataflow pipeline, so its latency is the fabric's timing estimate
        from edgekit.fabric import plan_estimate

        fabric = plan_estimate(stats, FABRIC_BITS[cand.precision], board.fpga)
        if fabric is not None:
            latency = fabric["latency_us"] / 1e3
    return Estimate(
        candidate=cand,
        ram_mb=weights_mb + act_mb + board.runtime_overhead_mb,
        storage_mb=weights_mb,
        latency_ms=latency,
        energy_mj=mode.power_w * latency,
        power_w=mode.power_w,
        weights_mb=weights_mb,
        activations_mb=act_mb,
        runtime_overhead_mb=board.runtime_overhead_mb,
        layers=layers,
        fabric=fabric,
    )


def calibrated(board: Board) -> Board:
    """The board with the cost-model constants of its stored calibration (edgekit calibrate), if any."""
    from edgekit.calibration_store import load_fit

    fit = load_fit(board.id)
    if not fit:
        return board
    return apply_fit(board, fit)


def apply_fit(board: Board, fit: dict[str, Any]) -> Board:
    """``board`` with a fit's constants in place of the profile's (what the fit left out stays)."""
    eff = dict(board.efficiency)
    eff.update({k: max(1e-6, v) for k, v in fit["efficiency"].items()})  # > 1: the profile's peak is too low
    return board.model_copy(update={
        "efficiency": eff, "launch_overhead_us": fit["launch_overhead_us"],
        "class_efficiency": board.class_efficiency | fit.get("class_efficiency", {}),
        "activation_passes": board.activation_passes | fit.get("activation_passes", {}),
        "memory_bandwidth_gbps": board.memory_bandwidth_gbps * fit.get("bandwidth_factor", 1.0)})
