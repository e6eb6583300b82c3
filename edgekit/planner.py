"""The planner: the board's budgets choose precision, pruning and power mode before anything is built.

1. Candidates: every precision the target and the board both offer x structured pruning
   ratios (only for models that :func:`edgekit.prune.can_prune` can rebuild: an ``nn.Module``
   from ``pkg.module:factory``, not a ``.pt2`` / TorchScript / ONNX file) x 2:4 sparsity
   (boards with ``sparsity_2_4``) x power modes.
2. Each candidate is estimated by :mod:`edgekit.costmodel` (with the board's stored
   calibration applied) and checked against every budget.
3. The choice is the least compressed candidate that fits (no pruning before pruning,
   fp32 before fp16 before int8-weight before int8 before int4-weight), then the least
   energy, then the lowest latency. The reason names the budget that ruled out the less
   compressed candidates.
4. Nothing fits: :class:`PlanError` names each budget that cannot be met and by how
   much, for the nearest candidate.
5. With eval data (:func:`refine`), the choice is built with the target's converter, its
   accuracy measured, and while the drop exceeds the accuracy budget the most sensitive
   layers are kept in float (per-layer sensitivity), re-checked each time.

The model is loaded, analyzed and (for torch) exported to ONNX once (:func:`analyze`); the
estimate, every build and the accuracy measurements reuse that :class:`Analyzed`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.analyze import WEIGHT_OPS, ModelStats
from edgekit.costmodel import Candidate, Estimate, calibrated, estimate
from edgekit.errors import EdgekitError
from edgekit.fabric import FIT_SHARE
from edgekit.fsutil import work_dir
from edgekit.profiles import PRECISION_ORDER, Board, Target, load_target
from edgekit.units import fmt_mb, fmt_mb_distinct

if TYPE_CHECKING:
    from edgekit.ingest import Model

PRUNE_RATIOS = (0.0, 0.25, 0.5)
BUDGET_UNITS = {"ram_mb": "MB", "storage_mb": "MB", "latency_ms": "ms", "power_w": "W", "energy_mj": "mJ",
                "fabric_share": "of the fabric"}
BUDGET_FLAGS = {"ram_mb": "--max-ram-mb", "storage_mb": "--max-storage-mb", "latency_ms": "--max-latency-ms",
                "power_w": "--max-power-w", "energy_mj": "--max-energy-mj",
                "accuracy_drop_points": "--max-accuracy-drop"}


class PlanError(EdgekitError):
    """No candidate fits the budgets; the message names the budget and the nearest candidate."""


@dataclass
class Budgets:
    """Absolute budgets for one plan (the board's defaults, with CLI overrides).

    ``ram_mb`` is the whole process (runtime overhead + weights + activations): by default
    the profile's ``runtime_overhead_mb`` plus ``model_ram_share`` of the board's RAM.
    ``power_w`` is compared with the power mode's figure.
    """

    ram_mb: float
    storage_mb: float
    latency_ms: float
    power_w: float
    energy_mj: float | None = None
    accuracy_drop_points: float = 1.0
    fabric_share: float | None = None  # FPGA boards: the share of the fabric a build may take (routing headroom)

    @classmethod
    def for_board(cls, board: Board, **overrides: float | None) -> Budgets:
        b = board.budgets
        out = cls(
            # the whole process: the runtime's own RAM plus the model's share of the board's RAM
            ram_mb=min(float(board.ram_mb), b.model_ram_share * board.ram_mb + board.runtime_overhead_mb),
            storage_mb=b.storage_mb if b.storage_mb is not None else float(board.storage_mb),
            latency_ms=b.latency_ms,
            power_w=b.power_w,
            energy_mj=b.energy_mj,
            accuracy_drop_points=b.accuracy_drop_points,
            fabric_share=FIT_SHARE if board.fpga is not None else None,
        )
        for k, v in overrides.items():
            if k not in BUDGET_FLAGS:
                raise TypeError(f"unknown budget {k}")
            if v is not None:
                if not math.isfinite(v) or v < 0 or (v == 0 and k != "accuracy_drop_points"):
                    raise PlanError(f"{BUDGET_FLAGS[k]} must be a finite positive number (got {v})")
                setattr(out, k, float(v))
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Scored:
    estimate: Estimate
    usage: dict[str, float]  # estimate / budget per resource
    over: dict[str, float]  # resource -> amount over budget (absolute, in its unit)

    @property
    def fits(self) -> bool:
        return not self.over

    @property
    def binding(self) -> str:
        """The budget closest to its limit (power only when exceeded: it is the power mode's own figure)."""
        keys = [k for k in self.usage if k != "power_w" or k in self.over] or list(self.usage)
        return max(keys, key=lambda k: self.usage[k])

    def to_json(self) -> dict[str, Any]:
        return {**self.estimate.to_json(), "fits": self.fits, "binding": self.binding,
                "usage": {k: round(v, 4) for k, v in self.usage.items()},
                "over": {k: round(v, 6) for k, v in self.over.items()}}


@dataclass
class EvalStep:
    float_layers: list[str]
    accuracy: float
    float_accuracy: float
    drop_points: float


@dataclass
class Plan:
    board: str
    target: str
    budgets: Budgets
    candidates: list[Scored]
    choice: Scored
    reason: str
    stats: ModelStats
    calibrated: bool = False
    eval_steps: list[EvalStep] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)  # layer -> accuracy points regained in float
    build_dir: Path | None = None
    notes: list[str] = field(default_factory=list)
    profile: Board | None = None  # the board as estimated (with calibration and --set applied)
    pruning: dict[str, Any] | None = None  # what torch-pruning did, when the choice prunes and was built

    @property
    def precision(self) -> str:
        return self.choice.estimate.candidate.precision

    @property
    def candidate(self) -> Candidate:
        return self.choice.estimate.candidate

    def to_json(self, layers: bool = True) -> dict[str, Any]:
        return {
            "board": self.board,
            "target": self.target,
            "budgets": self.budgets.to_json(),
            "calibrated": self.calibrated,
            "choice": {**self.choice.to_json(), **({"layers": self.choice.estimate.to_json(True)["layers"]}
                                                   if layers else {})},
            "reason": self.reason,
            "candidates": [c.to_json() for c in self.candidates],
            "eval_steps": [asdict(s) for s in self.eval_steps],
            "sensitivity": self.sensitivity,
            "pruning": self.pruning,
            "build_dir": str(self.build_dir) if self.build_dir else None,
            "notes": self.notes,
        }


# ---------------------------------------------------------------- analysis


@dataclass
class Analyzed:
    """A model loaded and analyzed once. ``float_graph`` is the graph the stats came from (the torch
    model's ONNX export, an ONNX model's own file): the planner's builds reuse it instead of exporting
    again, so it must outlive them (it lives in the folder given to :func:`analyze`)."""

    model: Model
    stats: ModelStats
    float_graph: Path


def plan_target(board: Board, target: Target | str | None) -> Target | None:
    """The target a plan is for: the one given, else the board's first."""
    if isinstance(target, str):
        return load_target(target)
    if target is None and board.targets:
        return load_target(board.targets[0])
    return target


def analyze(model: Any, target: Target | None, work_dir: Path, input_shape: list[str] | None = None,
            trust_pickle: bool = False) -> Analyzed:
    """Load ``model`` (a path, ``pkg.module:factory``, or an already loaded Model) and analyze it, once:
    the analyze stage of the pipeline (:func:`edgekit.analyze.analyze_model`), its float graph kept in
    ``work_dir``. An :class:`Analyzed` is returned as it is."""
    from edgekit.analyze import analyze_model as analyze_graph
    from edgekit.ingest import Model, load_model

    if isinstance(model, Analyzed):
        return model
    m = model if isinstance(model, Model) else load_model(model, input_shape, trust_pickle)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    stats, graph = analyze_graph(m, Path(work_dir), target)
    return Analyzed(m, stats, graph)


def model_stats(model: Any, target: Target | None = None, input_shape: list[str] | None = None,
                  trust_pickle: bool = False):
    """(Model, ModelStats) for a path, ``pkg.module:factory`` or loaded Model (the float graph is not kept)."""
    with work_dir("edgekit-plan-") as tmp:
        a = analyze(model, target, Path(tmp), input_shape, trust_pickle)
    return a.model, a.stats


# ---------------------------------------------------------------- search


def precisions_for(board: Board, target: Target | None) -> list[str]:
    offered = board.precisions
    if target is not None:
        offered = [p for p in offered if p in target.precisions]
    return [p for p in PRECISION_ORDER if p in offered]


def candidates(board: Board, target: Target | None, prunable: bool = True) -> list[Candidate]:
    out: list[Candidate] = []
    sparse = getattr(board, "sparsity_2_4", False)
    for mode in board.power_modes:
        for prec in precisions_for(board, target):
            for r in PRUNE_RATIOS if prunable else (0.0,):
                out.append(Candidate(prec, mode, r))
            if sparse and prec in ("fp16", "int8"):
                out.append(Candidate(prec, mode, 0.0, "2:4"))
    return out


def compression_rank(c: Candidate, native: str | None = None) -> tuple:
    """Smaller = less compressed. Pruning hurts accuracy more than a narrower format, so it ranks first. The
    board's ``native`` precision (what its accelerator computes in) ranks before every other."""
    prune = 0 if not c.prune_ratio and not c.sparsity else (1 if c.sparsity else 1 + c.prune_ratio)
    prec = -1 if c.precision == native else PRECISION_ORDER.index(c.precision)
    return (prune, prec, len(c.float_layers) * -1)


def score(est: Estimate, budgets: Budgets) -> Scored:
    values = {"ram_mb": est.ram_mb, "storage_mb": est.storage_mb, "latency_ms": est.latency_ms,
              "power_w": est.power_w, "energy_mj": est.energy_mj, "fabric_share": est.fabric_share}
    usage, over = {}, {}
    for k, v in values.items():
        limit = getattr(budgets, k)
        if limit is None or v is None:
            continue
        usage[k] = v / limit
        if v > limit * (1 + 1e-9):
            over[k] = v - limit
    return Scored(est, usage, over)


BUDGET_NAMES = {"ram_mb": "RAM", "storage_mb": "storage", "latency_ms": "latency", "power_w": "power",
                "energy_mj": "energy", "accuracy_drop_points": "accuracy drop", "fabric_share": "fabric"}


def fmt_budget(k: str, v: float, digits: int = 6) -> str:
    """A budget or estimate in its unit, readable at any size: sizes in :func:`edgekit.units.fmt_mb`'s format
    ("65,536 MB", "1,500.1 MB", "57.5 KB"), the others to ``digits`` significant digits ("33.3 ms", "0.0731 ms")."""
    if BUDGET_UNITS[k] == "MB":
        return fmt_mb(v)
    if k == "fabric_share":
        return f"{v:.0%} {BUDGET_UNITS[k]}"
    return (f"{v:,.0f}" if abs(v) >= 10**digits else f"{v:,.{digits}g}") + f" {BUDGET_UNITS[k]}"


def fmt_budgets(k: str, *vs: float) -> list[str]:
    """Several figures of one budget, sizes with the decimals that keep different figures different."""
    return fmt_mb_distinct(*vs) if BUDGET_UNITS[k] == "MB" else [fmt_budget(k, v) for v in vs]


def tightest(s: Scored, budgets: Budgets) -> str:
    """The budget a fitting candidate comes closest to, e.g. "RAM at 27% of 5,596 MB (runtime 1,500 MB + model
    65.7 KB)": the runtime's own RAM is named, as it can dominate a small model's figure."""
    k, e = s.binding, s.estimate
    if k == "fabric_share" and e.fabric is not None:
        util = e.fabric["estimate"]["utilization"]
        res = max(util, key=lambda r: util[r])
        return (f"the fabric, {res.upper()} at {util[res]:.0%} of the board at reuse factor "
                f"{e.fabric['reuse_factor']} ({getattr(budgets, k):.0%} usable)")
    out = f"{BUDGET_NAMES[k]} at {s.usage[k]:.0%} of {fmt_budget(k, getattr(budgets, k))}"
    if k == "ram_mb" and e.runtime_overhead_mb:
        out += (f" (runtime {fmt_budget(k, e.runtime_overhead_mb)} + model "
                f"{fmt_budget(k, e.ram_mb - e.runtime_overhead_mb)})")
    return out


def choose(
    model: Any,
    board: Board,
    target: Target | str | None = None,
    budgets: Budgets | None = None,
    *,
    stats: ModelStats | None = None,
    input_shape: list[str] | None = None,
    trust_pickle: bool = False,
    use_calibration: bool = True,
    prunable: bool | None = None,
) -> Plan:
    """Pick the least compressed candidate that fits every budget, by estimate (nothing is built).

    ``model``: an :class:`Analyzed` (what :func:`refine` then reuses), a loaded Model, a path or
    ``pkg.module:factory`` (loaded and analyzed here), or None with ``stats``. Pruned candidates are
    offered only when :func:`edgekit.prune.can_prune` can rebuild the model (a note says why not);
    ``prunable`` overrides that, and is the caller's to give when there is no model.
    """
    from edgekit.ingest import Model

    tgt = plan_target(board, target)
    m = None
    if isinstance(model, Analyzed):
        m, stats = model.model, stats or model.stats
    elif stats is None:
        m, stats = model_stats(model, tgt, input_shape, trust_pickle)
    elif isinstance(model, Model):
        m = model
    elif model is not None and prunable is None:  # stats given for a path: load it only to ask can_prune
        from edgekit.ingest import load_model

        m = load_model(model, input_shape, trust_pickle)
    notes: list[str] = []
    if prunable is None and m is not None:
        from edgekit.prune import can_prune

        prunable = can_prune(m)
        if not prunable:
            notes.append(f"no pruned candidates: structured pruning cannot rebuild {m.source} (kind {m.kind}: no "
                         "nn.Module left) — give the model as pkg.module:factory to let the planner prune")
    budgets = budgets or Budgets.for_board(board)
    brd = calibrated(board) if use_calibration else board
    scored = [score(estimate(stats, brd, c), budgets) for c in candidates(brd, tgt, prunable is not False)]
    if not scored:
        raise PlanError(f"board {board.id} and target {tgt.name if tgt else '-'} share no precision")
    native = board.native_precision
    scored.sort(key=lambda s: (compression_rank(s.estimate.candidate, native), s.estimate.energy_mj,
                               s.estimate.latency_ms))
    fitting = [s for s in scored if s.fits]
    if not fitting:
        raise PlanError(_nothing_fits(scored, budgets, board) + "".join(f" ({n})" for n in notes))
    best = fitting[0]
    reason = _reason(best, scored, budgets, native)
    fab = best.estimate.fabric
    if fab is not None:
        notes.append(f"fabric ESTIMATE at reuse factor {fab['reuse_factor']} ({fab['layers']} compute layers): "
                     f"{fabric_figures(fab, brd)}; latency {fab['latency_us']:g} µs, a new input every "
                     f"{fab['interval_us']:g} µs at {brd.fpga.fabric_clock_mhz:g} MHz (the build re-estimates "
                     "from its quantized graph; Vivado's report replaces both)")
    return Plan(board.id, tgt.name if tgt else "-", budgets, scored, best, reason, stats,
                calibrated=brd is not board, notes=notes, profile=brd)


def _nothing_fits(scored: list[Scored], budgets: Budgets, board: Board) -> str:
    nearest = min(scored, key=lambda s: (len(s.over), max(s.usage.values())))
    parts = []
    for k, amount in sorted(nearest.over.items(), key=lambda kv: -nearest.usage[kv[0]]):
        limit = getattr(budgets, k)
        lim, need = fmt_budgets(k, limit, limit + amount)
        if k == "fabric_share":
            parts.append(f"the fabric cannot hold it even at reuse factor {nearest.estimate.fabric['reuse_factor']}: "
                         f"{fabric_figures(nearest.estimate.fabric, board)}")
            continue
        parts.append(f"{BUDGET_NAMES[k]} budget {lim} cannot be met: needs {need} "
                     f"(+{fmt_budget(k, amount)}, {100 * (nearest.usage[k] - 1):.0f}% over)")
    flags = sorted({BUDGET_FLAGS[k] for k in nearest.over if k in BUDGET_FLAGS})
    fix = " or ".join(([f"relax {', '.join(flags)}"] if flags else [])
                      + (["choose a larger FPGA board (edgekit boards)"] if "fabric_share" in nearest.over else [])
                      + ["use a smaller model"])
    return (f"no build of this model fits board {board.id}: " + "; ".join(parts)
            + f" — nearest candidate {nearest.estimate.candidate.label}; {fix}")


def fabric_figures(fabric: dict[str, Any], board: Board) -> str:
    """"184 DSP of 220, 12 BRAM36 of 140, 31,024 LUT of 53,200, 19,400 FF of 106,400 (DSP over the 80% usable)"."""
    e, f = fabric["estimate"], board.fpga
    used = ", ".join(f"{e[k]:,} {name} of {getattr(f, k):,}" for k, name in
                     (("dsp", "DSP"), ("bram36", "BRAM36"), ("lut", "LUT"), ("ff", "FF")))
    over = f" ({e['limiting'].upper()} over the {FIT_SHARE:.0%} usable)" if e.get("limiting") else ""
    return used + over


def _reason(best: Scored, scored: list[Scored], budgets: Budgets, native: str | None = None) -> str:
    c = best.estimate.candidate
    less = [s for s in scored if compression_rank(s.estimate.candidate, native) < compression_rank(c, native)]
    if not less:
        what = (f"the board's accelerator computes in {native}, and" if c.precision == native
                else "the least compressed candidate")
        return f"{c.label}: {what} fits every budget (tightest: {tightest(best, budgets)})"
    # which budget ruled out the less compressed candidates: the one most of them exceed
    counts: dict[str, int] = {}
    for s in less:
        for k in s.over:
            counts[k] = counts.get(k, 0) + 1
    bind = max(counts, key=lambda k: counts[k])
    closest = min((s for s in less if bind in s.over), key=lambda s: s.over[bind])
    cc = closest.estimate.candidate
    limit = getattr(budgets, bind)
    lim, more, this = fmt_budgets(bind, limit, limit + closest.over[bind], best.usage[bind] * limit)
    return (f"{c.label}: {BUDGET_NAMES[bind]} budget {lim} binds — "
            f"the closest less compressed candidate ({cc.label}) needs {more}; this one needs {this}")


def plan_section(stats: ModelStats, board: Board, precision: str, plan: Plan | None = None) -> dict[str, Any]:
    """The manifest's ``plan``: the cost-model estimate of this build, and the planner's reason if it chose."""
    brd = calibrated(board)
    if plan is not None:
        est = plan.choice.estimate
    else:
        est = estimate(stats, brd, Candidate(precision, brd.default_power_mode))
    return {
        "chosen_by": "planner" if plan is not None else "user",
        "candidate": est.candidate.label,
        "power_mode": est.candidate.power_mode,
        "reason": plan.reason if plan is not None else None,
        "calibrated": brd is not board,
        "estimate": {k: round(getattr(est, k), 6) for k in ("latency_ms", "ram_mb", "storage_mb", "energy_mj", "power_w")},
        "budgets": plan.budgets.to_json() if plan is not None else Budgets.for_board(board).to_json(),
    }


def weight_layer_names(stats: ModelStats) -> list[str]:
    return [lay.name for lay in stats.layers if lay.op in WEIGHT_OPS and lay.params > 0]


def with_float_layers(plan: Plan, layers: list[str]) -> Scored:
    """Re-estimate the plan's choice with ``layers`` kept out of INT8 (after a sensitivity step), at the precision
    the target's kernels run them (``Target.kept_precision``: fp16 on TensorRT and Core ML, fp32 on LiteRT)."""
    kept = load_target(plan.target).kept_precision
    cand = replace(plan.candidate, float_layers=tuple(layers), kept_precision=kept)
    return score(estimate(plan.stats, plan.profile, cand), plan.budgets)
