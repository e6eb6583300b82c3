"""Verify: run the artifact with a real host runtime and compare with the float model.

Per output: max |converted - float| relative to max |float| over the golden set, and
top-1 agreement for classifier outputs ([batch, classes], classes > 1). With eval data,
float vs converted accuracy. Tolerances come from the target profile per precision.

An output whose kind's task metric is set and passes (top-1 agreement, SNR) is not failed by its
worst sample alone: a max error over ``max_rel_error`` is then a warning naming the sample
(``OutputCheck.warnings``; ``decided_by`` says which checks decided).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgekit.converters import Runner
from edgekit.data import Dataset
from edgekit.errors import InputSpecError
from edgekit.ingest import Model
from edgekit.profiles import Tolerance


@dataclass
class OutputCheck:
    name: str
    max_abs_error: float
    max_abs_reference: float
    max_rel_error: float
    tolerance_rel: float
    top1_agreement: float | None
    min_top1_agreement: float | None
    passed: bool
    top1_agreement_ci95: tuple[float, float] | None = None  # Wilson interval over the golden samples
    kind: str = "regression"  # class | regression | mask | index | detection | detection_cf | ctc
    metrics: dict[str, float] = field(default_factory=dict)  # the kind's own: snr_db, cosine, top5, iou, exact
    worst_sample: int | None = None  # golden sample index with the largest error
    # the axis of the model's own output that holds the batch (1 for a time-major [T, N, C] or a recurrent state
    # [layers, N, H]); "none" for an output without one (one sample per run, --batch-axis NAME=none)
    batch_axis: int | str = 0
    # the checks whose bars decide this output's verdict: its kind's task metric where the tolerance sets one
    # (top1_agreement, snr_db, iou ...), max_rel_error where there is none (or it fails, or max_error_decides)
    decided_by: list[str] = field(default_factory=list)
    # a max error over its bound where the task metric passes: reported with its sample, not deciding
    warnings: list[str] = field(default_factory=list)


@dataclass
class Verification:
    runtime: str
    precision: str
    golden_samples: int
    golden_source: str
    outputs: list[OutputCheck]
    float_accuracy: float | None = None
    converted_accuracy: float | None = None
    eval_samples: int | None = None
    max_accuracy_drop_points: float | None = None
    eval_output: str | None = None  # the output --eval labels were scored on
    float_accuracy_ci95: tuple[float, float] | None = None  # Wilson intervals: what n samples can tell
    converted_accuracy_ci95: tuple[float, float] | None = None
    # the drop (points) as the two models differ on the same samples: float right and converted wrong ("lost"),
    # the other way round ("won"), and a paired 95% interval of the drop (accuracy_drop)
    accuracy_lost: int | None = None
    accuracy_won: int | None = None
    accuracy_drop_ci95: tuple[float, float] | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # agreement with the float model on the held-out eval samples, per output (reported, not gating): its kind's
    # metrics (class: top1_agreement; regression / mask: snr_db, cosine, iou ...) and max_rel_error
    eval_agreement: dict[str, dict[str, float]] = field(default_factory=dict)
    # a model `edgekit finetune` wrote: the same metrics against the float model it was fine-tuned from (reported)
    against_original: dict[str, Any] | None = None
    # the float model the outputs were checked against, where not the model given: a fine-tuned .pt2 whose build
    # imposes its student's activation ranges is checked against the float model the student imitated
    reference_model: str | None = None
    # --carry: the float and the converted model each over the golden sequence carrying its own state
    # (edgekit.carry.carried_check): the pairs, and per output its error per chunk, at the first and last chunk
    carried: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        """The one verdict: every output check passed and no failure was recorded (an output check that
        fails always records its failure too; either alone fails the build)."""
        return not self.failures and all(o.passed for o in self.outputs)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def wilson(share: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion measured on ``n`` samples (sound at 0% and 100% too)."""
    if n <= 0:
        return (0.0, 1.0)
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (float(max(0.0, centre - half)), float(min(1.0, centre + half)))


def accuracy_drop(float_right: np.ndarray, converted_right: np.ndarray) -> dict[str, Any]:
    """The accuracy drop (points) of a converted model against its float model on the same labelled samples,
    with a paired 95% interval. Only the m samples exactly one of the two gets right move the drop: the converted
    model loses ``lost`` of them (float right, converted wrong) and wins the rest. Conditional on m, ``lost`` is
    binomial, so the drop m/n x (2 lost/m - 1) takes the Wilson interval of lost/m. Two separate intervals on the
    accuracies overlap even where every differing sample went one way; this one does not."""
    f, q = np.asarray(float_right, bool), np.asarray(converted_right, bool)
    n, lost, won = len(f), int((f & ~q).sum()), int((~f & q).sum())
    m = lost + won
    lo, hi = wilson(lost / m, m) if m else (0.5, 0.5)
    scale = 100 * m / n if n else 0.0
    return {"drop": 100 * (lost - won) / n if n else 0.0, "ci95": (scale * (2 * lo - 1), scale * (2 * hi - 1)),
            "lost": lost, "won": won}


def run_all(runner: Runner, feeds: list[dict[str, np.ndarray]], model: Model | None = None) -> list[np.ndarray]:
    """Every feed through ``runner``; one array per output with the samples on axis 0 (``model``: its batch size
    and declared output batch axes; without it both are inferred from the feeds)."""
    return run_all_axes(runner, feeds, model)[0]


def feed_batch(feed: dict[str, np.ndarray]) -> int:
    """The samples in one feed: the first axis of its first input that has one."""
    return next((int(np.shape(v)[0]) for v in feed.values() if np.ndim(v)), 1)


def declared_output_axes(model: Model | None) -> list[int | str | None] | None:
    """Per output, the batch axis ``--batch-axis`` declared or a state input gave it (``"none"``: no batch axis,
    one sample per run), None where it is inferred from the outputs; None for a model that declares none."""
    if model is None or all(s.batch_axis == 0 for s in model.outputs):
        return None
    return [None if s.batch_axis == 0 else "none" if s.batch_axis is None else s.batch_axis for s in model.outputs]


def run_all_axes(runner: Runner, feeds: list[dict[str, np.ndarray]], model: Model | None = None
                 ) -> tuple[list[np.ndarray], list[int | str]]:
    """As run_all, and the axis each output keeps its batch on (a time-major [T, N, C] output: 1); the merged
    arrays have it moved first (firmware/common/edgekit_smoke.merge_batches, which the board runs too)."""
    batch = model.batch if model is not None else feed_batch(feeds[0])
    return output_checks().merge_batches([runner(f) for f in feeds], batch, declared_output_axes(model))


def run_pair(reference: Runner, artifact: Runner, feeds: list[dict[str, np.ndarray]], model: Model | None = None
             ) -> tuple[list[np.ndarray], list[np.ndarray], list[int | str]]:
    """The float and the converted outputs on ``feeds``, both merged on the batch axes the float outputs show
    (so a converted output is read exactly as its float one)."""
    ref, axes = run_all_axes(reference, feeds, model)
    batch = model.batch if model is not None else feed_batch(feeds[0])
    got = output_checks().merge_batches([artifact(f) for f in feeds], batch, axes)[0]
    return ref, got, axes


def samples_first(model: Model, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The inputs of ``feeds`` joined as a data file holds them: ``[N, *sample]`` per input (each batch axis moved
    first; an input without one stacked, one sample per run)."""
    out = {}
    for s in model.inputs:
        parts = [f[s.name] for f in feeds]
        out[s.name] = (np.stack(parts) if s.batch_axis is None else
                       np.concatenate([np.moveaxis(p, s.batch_axis, 0) for p in parts]))
    return out


def top1_right(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per sample, whether its arg-max class is the label (logits: [N, classes] or [N, ...])."""
    return np.argmax(logits.reshape(len(labels), -1), axis=1) == labels


def top1_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Share of samples whose arg-max class is the label (logits: [N, classes] or [N, ...])."""
    return float(np.mean(top1_right(logits, labels)))


def eval_accuracy(runner: Runner, model: Model, ds: Dataset, output: int | None = None) -> float:
    """Top-1 accuracy of ``runner`` (the float model or an artifact) on a labelled data set, scored on ``output``
    (default: the output verify scores labels on, the first ``class`` output, as pick_eval_output chooses)."""
    if output is None:
        output = pick_eval_output(model, infer_kinds(model, model.reference(), ds), None)
    feeds = list(ds.batches(model))
    n = len(feeds) * model.batch
    return top1_accuracy(run_all(runner, feeds, model)[output], ds.labels[:n])


def output_checks() -> Any:
    """The one output-check implementation: ``firmware/common/edgekit_smoke.py`` (the board runs it too)."""
    from edgekit.converters import load_firmware

    return load_firmware("common", "edgekit_smoke")


def reference_outputs(model: Model, reference: Runner, golden: Dataset) -> list[np.ndarray]:
    """The float outputs on the golden samples (batches of 16), as ``infer_kinds`` reads them."""
    feeds = list(golden.batches(model, min(len(golden), 16)))
    return run_all(reference, feeds, model) if feeds else [np.zeros((0, *s.sample_shape)) for s in model.outputs]


def infer_kinds(model: Model, reference: Runner, golden: Dataset, overrides: dict[str, str] | None = None,
                outputs: list[np.ndarray] | None = None) -> dict[str, str]:
    """Each output's kind (class / regression / mask / index) from the float outputs on the golden samples, a YOLO
    head of an ONNX graph as ``detection_cf`` (edgekit.detection_head), with ``--output-kind name=kind`` overrides
    (names checked). ``outputs``: those float outputs, where the caller has them already (``reference_outputs``);
    the model is not run again."""
    smoke = output_checks()
    names = [s.name for s in model.outputs]
    overrides = dict(overrides or {})
    for name, kind in overrides.items():
        if name not in names:
            raise InputSpecError(f"--output-kind {name}={kind}: the model has no output {name!r} (its outputs: "
                                 f"{', '.join(names)})")
        if kind not in smoke.KINDS:
            raise InputSpecError(f"--output-kind {name}={kind}: choose one of {', '.join(smoke.KINDS)}")
    ref = outputs if outputs is not None else reference_outputs(model, reference, golden)
    heads = {}
    prep = getattr(model, "onnx_prep", None)
    if prep is not None and not prep.quantized_ops:
        from edgekit.detection_head import detection_heads

        heads = detection_heads(prep.proto, dict(zip(names, ref, strict=True)))
    return {n: overrides.get(n) or heads.get(n) or smoke.infer_kind(r, len(names))
            for n, r in zip(names, ref, strict=True)}


def pick_eval_output(model: Model, kinds: dict[str, str], name: str | None) -> int:
    """The output that ``--eval`` labels are scored on: ``--eval-output``, else the first ``class`` output."""
    names = [s.name for s in model.outputs]
    if name is not None:
        if name not in names:
            raise InputSpecError(f"--eval-output {name}: the model has no output {name!r} (its outputs: "
                                 f"{', '.join(names)})")
        return names.index(name)
    classes = [i for i, n in enumerate(names) if kinds.get(n) == "class"]
    if not classes:
        raise InputSpecError(f"--eval labels need a class output to score; the outputs are "
                             f"{', '.join(f'{n} ({kinds[n]})' for n in names)}: name one with --eval-output, "
                             "or mark it with --output-kind NAME=class")
    return classes[0]


def _worst_needs_eval(check: OutputCheck, on_eval: dict[str, Any], n: int, failures: list[str]) -> None:
    """A golden max error over its bound is only a warning where the output's task metric passes; with eval data
    that metric must pass on the held-out eval samples too. Where it fails there, the worst golden sample decides
    again: ``check`` fails, with a failure in ``failures`` that names both."""
    if not check.warnings or on_eval["passed"]:
        return
    why = on_eval["failures"][0].replace("golden ", "")
    for w in check.warnings:
        failures.append(w.split(": reported, not deciding", 1)[0]
                        + f": the worst sample decides, as the task metric fails on the {n} eval samples ({why})")
    check.warnings = []
    check.passed = False
    check.decided_by = [*check.decided_by, "max_rel_error"]


def verify(
    model: Model,
    reference: Runner,
    artifact: Runner,
    golden: Dataset,
    golden_count: int,
    tol: Tolerance,
    runtime: str,
    precision: str,
    eval_data: Dataset | None = None,
    kinds: dict[str, str] | None = None,
    eval_output: int | None = None,
    eval_pair: Callable[[Runner, Runner, Dataset], tuple[list[np.ndarray], list[np.ndarray]]] | None = None,
) -> tuple[Verification, dict[str, np.ndarray], list[np.ndarray]]:
    """Returns the verification, the golden input arrays and the float golden outputs.

    Each output is judged by its kind's metric with the one implementation the board runs too
    (``firmware/common/edgekit_smoke.check_output``); ``kinds`` default to what the float outputs show.

    ``eval_pair(reference, artifact, eval samples)``: the float and the converted outputs on the eval samples,
    where they do not run batch by batch (``run_pair``): a carried state (edgekit.carry) runs them in order, each
    model carrying its own."""
    smoke = output_checks()
    feeds = list(golden.batches(model, golden_count))
    ref, got, axes = run_pair(reference, artifact, feeds, model)
    names = [s.name for s in model.outputs]
    kinds = kinds or {n: smoke.infer_kind(r, len(names)) for n, r in zip(names, ref, strict=True)}
    checks, failures = [], []
    tol_d = tol.model_dump()
    for name, r, g, axis in zip(names, ref, got, axes, strict=True):
        c = smoke.check_output(name, kinds[name], r, g, tol_d, precision)
        agree = c["top1_agreement"]
        metrics = {k: c[k] for k in ("snr_db", "cosine", "top5_agreement", "iou", "exact_match", "text_agreement",
                                     "cer", "confidence_max_diff", "near_tie_disagreements") if k in c}
        checks.append(OutputCheck(
            name, c["max_abs_error"], c["max_abs_reference"], c["max_rel_error"], c["tolerance_rel"], agree,
            tol.min_top1_agreement if agree is not None else None, c["passed"],
            None if agree is None else wilson(agree, len(r)), kinds[name], metrics, c["worst_sample"], axis,
            c["decided_by"], c["warnings"]))
        failures += c["failures"]
    golden_inputs = samples_first(model, feeds)
    v = Verification(runtime, precision, len(ref[0]), golden.source, checks, failures=failures)
    if golden.random:
        v.notes.append("golden inputs are random: the outputs are compared, but accuracy on real data is unknown")
    if eval_data is not None:
        efeeds = list(eval_data.batches(model))
        n = len(efeeds) * model.batch
        if eval_pair is not None:
            fref, fgot = eval_pair(reference, artifact, eval_data.subset(np.arange(n)))
        else:
            fref, fgot, _ = run_pair(reference, artifact, efeeds, model)
        v.eval_samples = n
        positions, eval_failures = {}, {}
        for i, name in enumerate(names):
            c = smoke.check_output(name, kinds[name], fref[i], fgot[i], tol_d, precision)
            eval_failures[name] = c["failures"]
            _worst_needs_eval(checks[i], c, n, v.failures)
            positions[name] = c.get("positions", n)  # a per-position class output ([N, T, C]) has N x T decisions
            v.eval_agreement[name] = {k: float(c[k]) for k in ("top1_agreement", "snr_db", "cosine", "iou",
                                                                "exact_match", "max_rel_error", "disagreements",
                                                                "near_tie_disagreements", "text_agreement", "cer",
                                                                "confidence_max_diff")
                                      if c.get(k) is not None and np.isfinite(c[k])}
        if eval_data.labels is None:  # no labels: agreement with the float model on every eval sample
            for i, name in enumerate(names):
                ea = v.eval_agreement[name]
                if kinds[name] in ("ctc", "class") and not ({"text_agreement", "top1_agreement"} & set(ea)):
                    # no decision to agree on (non-finite or wrongly shaped outputs): say why, not a KeyError
                    v.notes.append(f"output {name!r}: no agreement measured on the {n} eval samples: "
                                   f"{eval_failures[name][0] if eval_failures[name] else 'no metric'}")
                    continue
                if kinds[name] == "ctc":
                    v.notes.append(f"output {name!r}: the decoded text matches float on {ea['text_agreement']:.1%} of "
                                   f"{n} eval samples (95% CI {wilson(ea['text_agreement'], n)[0]:.1%}–"
                                   f"{wilson(ea['text_agreement'], n)[1]:.1%}; no labels), character error rate "
                                   f"{ea['cer']:.2%}, line confidence moves by {ea['confidence_max_diff']:.3f} at most")
                if kinds[name] == "class":
                    share, m = v.eval_agreement[name]["top1_agreement"], positions[name]
                    what = "eval samples" if m == n else f"positions of {n} eval samples"
                    ties = (f"; {ea['near_tie_disagreements']:.0f} of the {ea['disagreements']:.0f} disagreements are "
                            "near-ties (float's top-2 margin under 1% of the output range)"
                            if ea.get("near_tie_disagreements") else "")
                    v.notes.append(f"output {name!r}: top-1 agrees with float on {share:.1%} of {m} {what} "
                                   f"(95% CI {wilson(share, m)[0]:.1%}–{wilson(share, m)[1]:.1%}; no labels){ties}")
            return v, golden_inputs, ref
        k = eval_output if eval_output is not None else pick_eval_output(model, kinds, None)
        labels = eval_data.labels[:n]
        v.eval_output = names[k]
        f_right, q_right = top1_right(fref[k], labels), top1_right(fgot[k], labels)
        v.float_accuracy, v.converted_accuracy = float(f_right.mean()), float(q_right.mean())
        v.float_accuracy_ci95 = wilson(v.float_accuracy, n)
        v.converted_accuracy_ci95 = wilson(v.converted_accuracy, n)
        pair = accuracy_drop(f_right, q_right)
        v.accuracy_lost, v.accuracy_won, v.accuracy_drop_ci95 = pair["lost"], pair["won"], pair["ci95"]
        v.max_accuracy_drop_points = tol.max_accuracy_drop_points
        drop = 100 * (v.float_accuracy - v.converted_accuracy)
        if not drop <= tol.max_accuracy_drop_points:  # NaN fails too
            v.failures.append(
                f"accuracy on {eval_data.source} (output {names[k]!r}): {v.converted_accuracy:.2%} converted vs "
                f"{v.float_accuracy:.2%} float, a drop of {drop:.2f} points (paired 95% CI {pair['ci95'][0]:.2f} to "
                f"{pair['ci95'][1]:.2f}; tolerance {tol.max_accuracy_drop_points} at {precision})"
            )
    return v, golden_inputs, ref
