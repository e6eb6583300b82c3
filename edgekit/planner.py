"""The planner: the board's budgets choose precision, pruning and power mode before anything is built.

1. Candidates: every precision the target and the board both offer x structured pruning
   ratios (torch models only) x 2:4 sparsity (boards with ``sparsity_2_4``) x power modes.
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
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit.analyze import WEIGHT_OPS, ModelStats
from edgekit.costmodel import Candidate, Estimate, calibrated, estimate
from edgekit.errors import EdgekitError
from edgekit.profiles import PRECISION_ORDER, Board, Target, load_target

PRUNE_RATIOS = (0.0, 0.25, 0.5)
BUDGET_UNITS = {"ram_mb": "MB", "storage_mb": "MB", "latency_ms": "ms", "power_w": "W", "energy_mj": "mJ"}
BUDGET_FLAGS = {"ram_mb": "--max-ram-mb", "storage_mb": "--max-storage-mb", "latency_ms": "--max-latency-ms",
                "power_w": "--max-power-w", "energy_mj": "--max-energy-mj",
                "accuracy_drop_points": "--max-accuracy-drop"}


class PlanError(EdgekitError):
    """No candidate fits the budgets; the message names the budget and the nearest candidate."""


@dataclass
class Budgets:
    """Absolute budgets for one plan (the board's defaults, with CLI overrides)."""

    ram_mb: float
    storage_mb: float
    latency_ms: float
    power_w: float
    energy_mj: float | None = None
    accuracy_drop_points: float = 1.0

    @classmethod
    def for_board(cls, board: Board, **overrides: float | None) -> Budgets:
        b = board.budgets
        out = cls(
            ram_mb=b.model_ram_share * board.ram_mb,
            storage_mb=b.storage_mb if b.storage_mb is not None else float(board.storage_mb),
            latency_ms=b.latency_ms,
            power_w=b.power_w,
            energy_mj=b.energy_mj,
            accuracy_drop_points=b.accuracy_drop_points,
        )
        for k, v in overrides.items():
            if k not in BUDGET_FLAGS:
                raise TypeError(f"unknown budget {k}")
            if v is not None:
                if v < 0 or (v == 0 and k != "accuracy_drop_points"):
                    raise PlanError(f"{BUDGET_FLAGS[k]} must be positive (got {v})")
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
        return max(self.usage, key=lambda k: self.usage[k])

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
            "build_dir": str(self.build_dir) if self.build_dir else None,
            "notes": self.notes,
        }


# ---------------------------------------------------------------- analysis


def analyze_model(model: Any, target: Target | None = None, input_shape: list[str] | None = None):
    """(Model, ModelStats) for a path, ``pkg.module:factory`` or loaded Model."""
    from edgekit.analyze import analyze_onnx
    from edgekit.ingest import Model, load_model
    from edgekit.onnx_graph import export_onnx

    m = model if isinstance(model, Model) else load_model(model, input_shape)
    with tempfile.TemporaryDirectory(prefix="edgekit-plan-") as tmp:
        path = Path(m.onnx_path) if not m.is_torch else export_onnx(
            m, Path(tmp) / "model.onnx", (target.opset if target else None) or 18)
        stats = analyze_onnx(path, target.supported_ops if target else None, target.name if target else None)
    return m, stats


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


def compression_rank(c: Candidate) -> tuple:
    """Smaller = less compressed. Pruning hurts accuracy more than a narrower format, so it ranks first."""
    prune = 0 if not c.prune_ratio and not c.sparsity else (1 if c.sparsity else 1 + c.prune_ratio)
    return (prune, PRECISION_ORDER.index(c.precision), len(c.float_layers) * -1)


def score(est: Estimate, budgets: Budgets) -> Scored:
    values = {"ram_mb": est.ram_mb, "storage_mb": est.storage_mb, "latency_ms": est.latency_ms,
              "power_w": est.power_w, "energy_mj": est.energy_mj}
    usage, over = {}, {}
    for k, v in values.items():
        limit = getattr(budgets, k)
        if limit is None:
            continue
        usage[k] = v / limit
        if v > limit * (1 + 1e-9):
            over[k] = v - limit
    return Scored(est, usage, over)


BUDGET_NAMES = {"ram_mb": "RAM", "storage_mb": "storage", "latency_ms": "latency", "power_w": "power",
                "energy_mj": "energy", "accuracy_drop_points": "accuracy drop"}


def _fmt(k: str, v: float) -> str:
    return f"{v:.6g} {BUDGET_UNITS[k]}"


def choose(
    model: Any,
    board: Board,
    target: Target | str | None = None,
    budgets: Budgets | None = None,
    *,
    stats: ModelStats | None = None,
    input_shape: list[str] | None = None,
    use_calibration: bool = True,
    prunable: bool | None = None,
) -> Plan:
    """Pick the least compressed candidate that fits every budget, by estimate (nothing is built)."""
    tgt = load_target(target) if isinstance(target, str) else target
    if tgt is None and board.targets:
        tgt = load_target(board.targets[0])
    if stats is None:
        m, stats = analyze_model(model, tgt, input_shape)
        if prunable is None:
            prunable = m.is_torch
    budgets = budgets or Budgets.for_board(board)
    brd = calibrated(board) if use_calibration else board
    scored = [score(estimate(stats, brd, c), budgets) for c in candidates(brd, tgt, prunable is not False)]
    if not scored:
        raise PlanError(f"board {board.id} and target {tgt.name if tgt else '-'} share no precision")
    scored.sort(key=lambda s: (compression_rank(s.estimate.candidate), s.estimate.energy_mj, s.estimate.latency_ms))
    fitting = [s for s in scored if s.fits]
    if not fitting:
        raise PlanError(_nothing_fits(scored, budgets, board))
    best = fitting[0]
    reason = _reason(best, scored, budgets)
    return Plan(board.id, tgt.name if tgt else "-", budgets, scored, best, reason, stats,
                calibrated=brd is not board)


def _nothing_fits(scored: list[Scored], budgets: Budgets, board: Board) -> str:
    nearest = min(scored, key=lambda s: (len(s.over), max(s.usage.values())))
    parts = []
    for k, amount in sorted(nearest.over.items(), key=lambda kv: -nearest.usage[kv[0]]):
        limit = getattr(budgets, k)
        parts.append(f"{BUDGET_NAMES[k]} budget {_fmt(k, limit)} cannot be met: needs {_fmt(k, limit + amount)} "
                     f"(+{_fmt(k, amount)}, {100 * (nearest.usage[k] - 1):.0f}% over)")
    flags = ", ".join(sorted({BUDGET_FLAGS[k] for k in nearest.over}))
    return (f"no build of this model fits board {board.id}: " + "; ".join(parts)
            + f" — nearest candidate {nearest.estimate.candidate.label}; relax {flags} or use a smaller model")


def _reason(best: Scored, scored: list[Scored], budgets: Budgets) -> str:
    c = best.estimate.candidate
    less = [s for s in scored if compression_rank(s.estimate.candidate) < compression_rank(c)]
    if not less:
        return (f"{c.label}: the least compressed candidate fits every budget "
                f"(tightest: {best.binding} at {best.usage[best.binding]:.0%} of budget)")
    # which budget ruled out the less compressed candidates: the one most of them exceed
    counts: dict[str, int] = {}
    for s in less:
        for k in s.over:
            counts[k] = counts.get(k, 0) + 1
    bind = max(counts, key=lambda k: counts[k])
    closest = min((s for s in less if bind in s.over), key=lambda s: s.over[bind])
    cc = closest.estimate.candidate
    return (f"{c.label}: {BUDGET_NAMES[bind]} budget {_fmt(bind, getattr(budgets, bind))} binds — "
            f"the closest less compressed candidate ({cc.label}) needs "
            f"{_fmt(bind, getattr(budgets, bind) + closest.over[bind])}; this one needs "
            f"{_fmt(bind, best.usage[bind] * getattr(budgets, bind))}")


def weight_layer_names(stats: ModelStats) -> list[str]:
    return [lay.name for lay in stats.layers if lay.op in WEIGHT_OPS and lay.params > 0]


def with_float_layers(plan: Plan, layers: list[str]) -> Scored:
    """Re-estimate the plan's choice with ``layers`` kept in fp32 (after a sensitivity step)."""
    from edgekit.profiles import load_board

    brd = calibrated(load_board(plan.board)) if plan.calibrated else load_board(plan.board)
    cand = replace(plan.candidate, float_layers=tuple(layers))
    return score(estimate(plan.stats, brd, cand), plan.budgets)
