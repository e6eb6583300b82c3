"""Verify: run the artifact with a real host runtime and compare with the float model.

Per output: max |converted - float| relative to max |float| over the golden set, and
top-1 agreement for classifier outputs ([batch, classes], classes > 1). With eval data,
float vs converted accuracy. Tolerances come from the target profile per precision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgekit.converters import Runner
from edgekit.data import Dataset
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
    float_accuracy_ci95: tuple[float, float] | None = None  # Wilson intervals: what n samples can tell
    converted_accuracy_ci95: tuple[float, float] | None = None
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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


def is_classifier(arr: np.ndarray) -> bool:
    return arr.ndim == 2 and arr.shape[1] > 1


def run_all(runner: Runner, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    outs = [runner(f) for f in feeds]
    return [np.concatenate([o[i] for o in outs]) for i in range(len(outs[0]))]


def top1_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Share of samples whose arg-max class is the label (logits: [N, classes] or [N, ...])."""
    return float(np.mean(np.argmax(logits.reshape(len(labels), -1), axis=1) == labels))


def eval_accuracy(runner: Runner, model: Model, ds: Dataset) -> float:
    """Top-1 accuracy of ``runner`` (the float model or an artifact) on a labelled data set, output 0."""
    feeds = list(ds.batches(model))
    n = sum(len(next(iter(f.values()))) for f in feeds)
    return top1_accuracy(run_all(runner, feeds)[0], ds.labels[:n])


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
) -> tuple[Verification, dict[str, np.ndarray], list[np.ndarray]]:
    """Returns the verification, the golden input arrays and the float golden outputs."""
    feeds = list(golden.batches(model, golden_count))
    ref = run_all(reference, feeds)
    got = run_all(artifact, feeds)
    checks = []
    failures = []
    names = [s.name for s in model.outputs]
    for name, r, g in zip(names, ref, got, strict=True):
        g = g.astype(np.float64).reshape(r.shape)
        r64 = r.astype(np.float64)
        nonfinite = int(np.count_nonzero(~np.isfinite(g))) + int(np.count_nonzero(~np.isfinite(r64)))
        err = float(np.max(np.abs(g - r64))) if r.size else 0.0
        scale = float(np.max(np.abs(r64))) if r.size else 0.0
        rel = err / scale if scale > 0 else err
        agree = None
        if is_classifier(r):
            agree = float(np.mean(np.argmax(g, axis=1) == np.argmax(r64, axis=1)))
        # written so that NaN fails: `not (nan <= tol)` is True
        rel_ok = bool(rel <= tol.max_rel_error) and not nonfinite
        agree_ok = agree is None or bool(agree >= tol.min_top1_agreement)
        checks.append(
            OutputCheck(name, err, scale, rel, tol.max_rel_error, agree,
                        tol.min_top1_agreement if agree is not None else None, rel_ok and agree_ok,
                        None if agree is None else wilson(agree, len(r)))
        )
        if nonfinite:
            failures.append(
                f"output {name!r}: {nonfinite} non-finite value(s) (NaN/Inf) in the float or converted outputs "
                "on the golden inputs"
            )
        elif not rel_ok:
            failures.append(
                f"output {name!r}: max error {err:.4g} is {rel:.2%} of the output range {scale:.4g} "
                f"(tolerance {tol.max_rel_error:.2%} at {precision})"
            )
        if not agree_ok:
            failures.append(
                f"output {name!r}: top-1 agrees with float on {agree:.1%} of {len(r)} golden samples "
                f"(needs {tol.min_top1_agreement:.0%} at {precision})"
            )
    golden_inputs = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
    v = Verification(runtime, precision, len(ref[0]), golden.source, checks, failures=failures)
    if golden.random:
        v.notes.append("golden inputs are random: the outputs are compared, but accuracy on real data is unknown")
    if eval_data is not None and eval_data.labels is not None:
        efeeds = list(eval_data.batches(model))
        n = sum(len(next(iter(f.values()))) for f in efeeds)
        labels = eval_data.labels[:n]
        v.float_accuracy = top1_accuracy(run_all(reference, efeeds)[0], labels)
        v.converted_accuracy = top1_accuracy(run_all(artifact, efeeds)[0], labels)
        v.eval_samples = n
        v.float_accuracy_ci95 = wilson(v.float_accuracy, n)
        v.converted_accuracy_ci95 = wilson(v.converted_accuracy, n)
        v.max_accuracy_drop_points = tol.max_accuracy_drop_points
        drop = 100 * (v.float_accuracy - v.converted_accuracy)
        if not drop <= tol.max_accuracy_drop_points:  # NaN fails too
            v.failures.append(
                f"accuracy on {eval_data.source}: {v.converted_accuracy:.2%} converted vs {v.float_accuracy:.2%} "
                f"float, a drop of {drop:.2f} points (tolerance {tol.max_accuracy_drop_points} at {precision})"
            )
    return v, golden_inputs, ref
