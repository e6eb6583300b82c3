"""The planner's build-and-measure loop: build the plan's choice with the pipeline, measure its accuracy on
eval data, and while the drop is over budget keep the most quantization-sensitive layers in float.

It sits above :mod:`edgekit.pipeline` (which it calls, and whose result objects it reads) and above
:mod:`edgekit.planner` (whose estimates it re-checks); nothing below imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.fsutil import work_dir
from edgekit.pipeline import convert
from edgekit.planner import (
    BUDGET_NAMES,
    Analyzed,
    EvalStep,
    Plan,
    PlanError,
    analyze,
    fmt_budget,
    weight_layer_names,
    with_float_layers,
)
from edgekit.profiles import Board, Target, load_target
from edgekit.verify import eval_accuracy, infer_kinds, pick_eval_output

class _Builder:
    """Builds one candidate with the target's converter (no bundle) and measures its eval accuracy.

    Used for the per-layer sensitivity scan, where a full pipeline run per layer would verify
    and bundle each time; the choice itself is built with the pipeline. Reuses the analyzed
    model's float graph, and measures each (precision, float layers) build once.
    """

    def __init__(self, analyzed: Analyzed, target: Target, board: Board, eval_ds, calib_ds, work: Path,
                 output: int, calibration: str | None = None) -> None:
        self.a, self.target, self.board, self.eval_ds, self.calib_ds, self.work = (
            analyzed, target, board, eval_ds, calib_ds, work)
        self.output = output  # the output labels are scored on (as the pipeline's verify scores them)
        self.known: dict[tuple[str, tuple[str, ...]], float] = {}  # (precision, float layers) -> accuracy
        self.n = 0
        self.calibration = calibration  # the INT8 calibration method the pipeline build chose (jetson), reused

    def accuracy(self, precision: str, float_layers: list[str]) -> float:
        from edgekit.converters import ConvertJob, get_converter

        key = (precision, tuple(float_layers))
        if key in self.known:
            return self.known[key]
        self.n += 1
        out, work = self.work / f"b{self.n}", self.work / f"w{self.n}"
        out.mkdir()
        work.mkdir()
        m = self.a.model
        job = ConvertJob(model=m, target=self.target, board=self.board, precision=precision,
                         calib=self.calib_ds, out_dir=out, work_dir=work,
                         options={"keep_float_nodes": list(float_layers),
                                  **({"calibration": self.calibration} if self.calibration else {})},
                         log=lambda msg: None, warn=lambda msg: None,
                         float_onnx=self.a.float_graph if m.is_torch else None)
        conv = get_converter(self.target.converter)
        art = conv.convert(job)
        self.known[key] = eval_accuracy(conv.host_runner(job, art), m, self.eval_ds, self.output)
        return self.known[key]


def _pipeline_accuracy(plan: Plan, a: Analyzed, out: Path, precision: str, float_layers: list[str], *,
                       eval_data: str, calib: str | None, board_set, log) -> tuple[float, float]:
    """Build the analyzed model with edgekit.pipeline.convert into ``out`` (no second load, analysis or
    export); (float accuracy, converted accuracy) from the pipeline's own verification result."""
    res = convert(a.model, target=plan.target, out=out, board=plan.board, precision=precision,
                  calib=calib, eval_data=eval_data, board_set=board_set,
                  options={"keep_float_nodes": list(float_layers)} if float_layers else None,
                  log=lambda m: None, warn=log, analysis=(a.stats, a.float_graph), fail_on_verification=False,
                  strict=True)  # the planner keeps layers float by its own accuracy search
    v = res.verification
    if not v.passed:  # the build is kept; the accuracy budget decides in refine
        log("host verification: " + "; ".join(v.failures))
    return v.float_accuracy, v.converted_accuracy


def refine(plan: Plan, model: Any, eval_data: str, *, calib: str | None = None, input_shape: list[str] | None = None,
           board_set: list[str] | None = None, out: str | Path | None = None, max_steps: int = 8,
           finetune_steps: int = 150, log=lambda m: None) -> Plan:
    """Build the choice (pruned first where it prunes), measure its accuracy on ``eval_data``; while the
    drop is over budget, keep the most quantization-sensitive layers in float (estimates re-checked).

    ``model``: the :class:`Analyzed` that :func:`choose` planned from (reused: not loaded, analyzed or
    exported again), else a loaded Model or a path (loaded and analyzed here, once). The float
    accuracy is measured once: by the first build's verification (of the unpruned model), or here
    before pruning.
    """
    from edgekit.data import load_npz
    from edgekit.profiles import load_board

    budget = plan.budgets.accuracy_drop_points
    cand = plan.candidate
    if cand.precision == "int8" and calib is None:
        raise PlanError("the plan chose int8: give --calib FILE.npz (real inputs) so the INT8 build can be calibrated")
    if cand.sparsity:
        raise PlanError(f"the plan chose {cand.label}: building 2:4 sparse models is not supported yet — relax the "
                        "budget that binds, or plan without --eval")
    with work_dir("edgekit-refine-") as tmp:
        work = Path(tmp)
        build = Path(out) if out else work / "build"
        tgt = load_target(plan.target)
        a = analyze(model, tgt, work / "float", input_shape)  # an Analyzed is used as it is
        m = a.model
        eval_ds = load_npz(eval_data, m, need_labels=True, what="--eval")
        scored = pick_eval_output(m, infer_kinds(m, m.reference(), eval_ds), None)  # as verify scores labels
        calib_ds = load_npz(calib, m, what="--calib") if calib else None
        float_acc = None  # the unpruned float model's accuracy: drops count from here
        if cand.prune_ratio:
            from edgekit.prune import prune, save_exported

            float_acc = eval_accuracy(m.reference(), m, eval_ds, scored)  # the builds below measure the pruned model
            pruned, info = prune(m, cand.prune_ratio, calib_ds, steps=finetune_steps)
            a = analyze(str(save_exported(pruned, m, work / "pruned.pt2")), tgt, work / "pruned")
            plan.pruning = info
            ft = info["finetune"]
            plan.notes.append(
                f"pruned {cand.prune_ratio:.0%} of channels with torch-pruning: MACs {info['macs_before']:,} -> "
                f"{info['macs_after']:,}, params {info['params_before']:,} -> {info['params_after']:,}; fine-tuned "
                f"{ft['steps']} steps ({ft['kind']}, on {ft['data']}): loss {ft['loss_before']:.4g} -> {ft['loss_after']:.4g}")
            log(plan.notes[-1])
        opts = dict(eval_data=eval_data, calib=calib, board_set=board_set, log=log)
        fa, ca = _pipeline_accuracy(plan, a, build, cand.precision, [], **opts)
        if float_acc is None:
            float_acc = fa  # measured by the build's verification on the same eval data
        drop = 100 * (float_acc - ca)
        plan.eval_steps.append(EvalStep([], ca, float_acc, drop))
        log(f"{cand.label}: accuracy {ca:.2%} (float {float_acc:.2%}, drop {drop:.2f} points, budget {budget})")
        if drop <= budget + 1e-9:
            plan.reason += f"; measured accuracy drop {drop:.2f} points is within the {budget} point budget"
            plan.build_dir = build if out else None
            return plan
        if cand.precision != "int8":
            raise PlanError(f"accuracy drop budget {budget} points cannot be met: {cand.label} loses "
                            f"{drop:.2f} points (+{drop - budget:.2f}); relax --max-accuracy-drop")
        # per-layer sensitivity: accuracy regained by keeping one layer in float
        import json

        q = json.loads((build / "manifest.json").read_text())["artifact"].get("quantization") or {}
        b = _Builder(a, tgt, load_board(plan.board, board_set), eval_ds, calib_ds, work, scored,
                     q.get("calibration_method"))
        b.known[(cand.precision, ())] = ca  # the pipeline build above is the no-float-layers build
        gain = {name: 100 * (b.accuracy(cand.precision, [name]) - ca) for name in weight_layer_names(plan.stats)}
        plan.sensitivity = dict(sorted(gain.items(), key=lambda kv: -kv[1]))
        log("sensitivity (points regained in float): " + ", ".join(f"{k} {v:+.2f}" for k, v in plan.sensitivity.items()))
        kept: list[str] = []
        for name in list(plan.sensitivity)[:max_steps]:
            kept.append(name)
            scored = with_float_layers(plan, kept)
            if not scored.fits:
                k, v = next(iter(scored.over.items()))
                raise PlanError(f"accuracy drop budget {budget} points cannot be met within the other budgets: keeping "
                                f"{len(kept)} layer(s) float exceeds the {BUDGET_NAMES[k]} budget by {fmt_budget(k, v)}")
            acc = b.accuracy(cand.precision, kept)
            log(f"{len(kept)} layer(s) float: accuracy {acc:.2%} (drop {100 * (float_acc - acc):.2f} points)")
            if 100 * (float_acc - acc) <= budget + 1e-9:
                break
        # re-check with the pipeline (the real build)
        _, ca = _pipeline_accuracy(plan, a, build, cand.precision, kept, **opts)
        drop = 100 * (float_acc - ca)
        plan.eval_steps.append(EvalStep(list(kept), ca, float_acc, drop))
        if drop > budget + 1e-9:
            raise PlanError(f"accuracy drop budget {budget} points cannot be met: with {len(kept)} sensitive layer(s) "
                            f"kept float, {cand.precision} still loses {drop:.2f} points (+{drop - budget:.2f}); "
                            "relax --max-accuracy-drop or a size/latency budget so a wider precision fits")
        plan.choice = with_float_layers(plan, kept)
        plan.reason += (f"; measured accuracy drop was over the {budget} point budget, so the {len(kept)} most "
                        f"sensitive layer(s) ({', '.join(kept)}) stay fp32: drop now {drop:.2f} points")
        plan.build_dir = build if out else None
    return plan
