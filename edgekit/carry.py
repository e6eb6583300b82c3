"""Carried state (``--carry OUT=IN``): a recurrent model's output OUT feeds its input IN on the next chunk.

The model keeps the state as an input and an output on every target, and edgekit treats the chunks of a data file
as time, in order:

- data files need only the other inputs: the state each chunk takes is the one the FLOAT model handed back after
  the chunk before it, run over the file in order from a zero state (:func:`with_states`), so INT8 calibration sees
  the states of real use. ``--sequence-length N`` cuts a file into sequences of N chunks (the last may be shorter),
  each starting again from zero; without it the file is one sequence.
- the golden samples are the first ``--golden`` chunks of the last sequence of the eval file (else the calibration
  file), in order, held out of calibration (:func:`golden_sequence`); the board's runner checks them chunk by
  chunk with the float model's states, as any golden sample.
- verification also runs the float model and the converted model each over that whole golden sequence (and over
  every ``--eval`` sequence) carrying its OWN state from chunk to chunk (:func:`run_carried`), and judges every
  output over all the chunks by the target's tolerances; it reports the error per chunk, at the first and the last
  chunk, and how the state drifts (:func:`carried_check`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.errors import InputSpecError
from edgekit.model import Model, TensorSpec

STATES_FROM = "the float model's, carried over each sequence in order from a zero state"


@dataclass(frozen=True)
class Carry:
    """The ``--carry`` pairs (output name, input name) checked against a model, and the sequence rule."""

    pairs: tuple[tuple[str, str], ...]
    sequence_length: int | None = None  # chunks per sequence in a data file; None: the whole file is one

    @property
    def inputs(self) -> set[str]:
        return {i for _, i in self.pairs}

    def to_json(self) -> dict[str, Any]:
        return {"pairs": [{"output": o, "input": i} for o, i in self.pairs], "sequence_length": self.sequence_length,
                "states": STATES_FROM}


def parse_carries(specs: list[str] | None) -> list[tuple[str, str]]:
    """``--carry state_out=state`` (repeat per state): (output, input) pairs, syntax checked."""
    out: list[tuple[str, str]] = []
    for spec in specs or []:
        o, sep, i = spec.partition("=")
        o, i = o.strip(), i.strip()
        if not sep or not o or not i:
            raise InputSpecError(f"--carry {spec!r}: expected OUTPUT=INPUT, the output that feeds the input on the "
                                 "next chunk, e.g. --carry state_out=state")
        out.append((o, i))
    for what, names in (("output", [o for o, _ in out]), ("input", [i for _, i in out])):
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise InputSpecError(f"--carry: {what} {dup!r} is named twice; give each state once")
    return out


def check_sequence_length(n: int | None, carries: list[str] | None) -> None:
    if n is None:
        return
    if not carries:
        raise InputSpecError(f"--sequence-length {n}: it cuts the data into sequences for a carried state; give "
                             "--carry OUTPUT=INPUT too")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputSpecError(f"--sequence-length {n}: give the chunks per sequence, at least 1")


def make_carry(model: Model, specs: list[str] | None, sequence_length: int | None = None) -> Carry | None:
    """The checked ``--carry`` pairs of ``model`` (None: none given). Each names an output and an input of the
    model, of one shape and dtype, batched on the same axis, with one sample per run (chunks run one after
    another)."""
    pairs = parse_carries(specs)
    check_sequence_length(sequence_length, specs)
    if not pairs:
        return None
    ins, outs = {s.name: s for s in model.inputs}, {s.name: s for s in model.outputs}
    listed = f"(its inputs: {', '.join(ins)}; outputs: {', '.join(outs)})"
    folded = set((model.onnx_prep.consts or {}) if model.onnx_prep is not None else {})
    for o, i in pairs:
        flag = f"--carry {o}={i}"
        if o not in outs:
            swapped = f" (give the output first: --carry {i}={o})" if o in ins and i in outs else ""
            raise InputSpecError(f"{flag}: the model has no output {o!r}{swapped} {listed}")
        if i not in ins:
            why = " (it was folded as a constant by --const: carry it or fold it, not both)" if i in folded else ""
            raise InputSpecError(f"{flag}: the model has no input {i!r}{why} {listed}")
        si, so = ins[i], outs[o]
        if so.shape and tuple(so.shape) != tuple(si.shape):
            raise InputSpecError(f"{flag}: output {o!r} has shape {list(so.shape)}, input {i!r} takes "
                                 f"{list(si.shape)}; a carried state goes in as it comes out")
        if so.shape and so.batch_axis != si.batch_axis:
            raise InputSpecError(f"{flag}: output {o!r} has its batch on axis {_axis(so)}, input {i!r} on "
                                 f"{_axis(si)}; declare both with --batch-axis")
        if model.batch != 1 or si.batch != 1:
            on = si.batch_axis if si.batch_axis is not None else "none"
            hint = (f"; if the batch of {i!r} {list(si.shape)} is on another axis, give --batch-axis {i}=AXIS"
                    if si.batch != model.batch else "; fix batch 1 with --input-shape")
            raise InputSpecError(f"{flag}: the chunks run one after another, one sample per run; the model takes "
                                 f"{model.batch} per run and {i!r} holds {si.batch} on its batch axis {on}{hint}")
    return Carry(tuple(pairs), sequence_length)


def _axis(s: TensorSpec) -> str:
    return "none" if s.batch_axis is None else str(s.batch_axis)


def sequences(n: int, length: int | None) -> list[tuple[int, int]]:
    """The [start, end) chunk ranges of a data file of ``n`` chunks: sequences of ``length`` (the last may be
    shorter), or the whole file."""
    step = length or max(n, 1)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _sample(spec: TensorSpec, x: np.ndarray) -> np.ndarray:
    """One sample of a tensor as the model holds it (batch 1), as a data file holds it."""
    x = np.asarray(x).reshape(spec.shape)
    return x if spec.batch_axis is None else np.moveaxis(x, spec.batch_axis, 0)[0]


def run_carried(runner: Callable[[dict[str, np.ndarray]], list[np.ndarray]], model: Model, carry: Carry,
                ds: Any, seqs: list[tuple[int, int]]) -> tuple[list[list[np.ndarray]], dict[str, np.ndarray]]:
    """``runner`` over the chunks of ``ds`` in order, each sequence starting from the states its first chunk holds
    and then carrying the runner's own: per chunk, its outputs; and the states each chunk took (samples first)."""
    out_index = {s.name: k for k, s in enumerate(model.outputs)}
    specs = {s.name: s for s in model.inputs}
    taken = {i: np.array(ds.inputs[i], copy=True) for i in carry.inputs}
    per_chunk: list[list[np.ndarray]] = []
    for a, b in seqs:
        state = {i: specs[i].to_model_layout(ds.inputs[i][a:a + 1]) for i in carry.inputs}
        for c in range(a, b):
            feed = {s.name: state[s.name] if s.name in state else s.to_model_layout(ds.inputs[s.name][c:c + 1])
                    for s in model.inputs}
            for i in carry.inputs:
                taken[i][c] = _sample(specs[i], state[i])
            outs = runner(feed)
            per_chunk.append(list(outs))
            state = {i: np.ascontiguousarray(np.asarray(outs[out_index[o]]).reshape(specs[i].shape)
                                             .astype(specs[i].dtype)) for o, i in carry.pairs}
    return per_chunk, taken


def with_states(model: Model, ds: Any, carry: Carry) -> Any:
    """``ds`` with each carried input's samples the states the float model hands back, run over the chunks in
    order (each sequence from a zero state)."""
    from edgekit.data import Dataset

    inputs = dict(ds.inputs)
    for i in carry.inputs:
        spec = next(s for s in model.inputs if s.name == i)
        inputs[i] = np.zeros((len(ds), *spec.sample_shape), spec.dtype)
    filled = Dataset(ds.source, inputs, ds.labels, ds.random)
    _, states = run_carried(model.reference(), model, carry, filled, sequences(len(ds), carry.sequence_length))
    return Dataset(ds.source, {**inputs, **states}, ds.labels, ds.random, ds.unused)


def golden_sequence(n: int, golden_count: int, carry: Carry) -> np.ndarray:
    """The golden chunks of a data file of ``n`` chunks: the first ``golden_count`` of its last sequence."""
    a, b = sequences(n, carry.sequence_length)[-1]
    return np.arange(a, min(b, a + golden_count))


def merged(model: Model, per_chunk: list[list[np.ndarray]], axes: list[int | str] | None = None
           ) -> list[np.ndarray]:
    """Per-chunk outputs merged samples first, as :func:`edgekit.verify.run_all` merges batches."""
    from edgekit.verify import declared_output_axes, output_checks

    return output_checks().merge_batches(per_chunk, 1, axes if axes is not None else declared_output_axes(model))[0]


def run_pair_carried(model: Model, carry: Carry, reference: Callable, artifact: Callable, ds: Any
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The float and the converted outputs over every sequence of ``ds``, each model carrying its own state."""
    seqs = sequences(len(ds), carry.sequence_length)
    from edgekit.verify import declared_output_axes, output_checks

    ref_chunks = run_carried(reference, model, carry, ds, seqs)[0]
    ref, axes = output_checks().merge_batches(ref_chunks, 1, declared_output_axes(model))
    got = merged(model, run_carried(artifact, model, carry, ds, seqs)[0], axes)
    return ref, got


def _quarter(x: np.ndarray, last: bool) -> float:
    k = max(1, len(x) // 4)
    return float(np.mean(x[-k:] if last else x[:k]))


def carried_check(model: Model, carry: Carry, reference: Callable, artifact: Callable, golden: Any,
                  kinds: dict[str, str], tol: dict[str, Any], precision: str) -> tuple[dict[str, Any], list[str]]:
    """The float and the converted model each over the golden sequence, each carrying its own state: every output
    judged over all the chunks by the target's tolerances (``check_output``, as the golden check), with its error
    per chunk (max |converted - float| of the chunk over the output's range on the sequence), at the first and the
    last chunk, and the mean over the first and the last quarter of the chunks (a state that drifts shows there).
    Returns the record (``Verification.carried``) and the failures."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    n = len(golden)
    ref, got = run_pair_carried(model, carry, reference, artifact, golden)
    states = {o for o, _ in carry.pairs}
    record: dict[str, Any] = {**carry.to_json(), "chunks": n, "sequence": golden.source, "outputs": {}}
    failures: list[str] = []
    for spec, r, g in zip(model.outputs, ref, got, strict=True):
        r64, g64 = np.asarray(r, np.float64), np.asarray(g, np.float64).reshape(np.shape(r))
        scale = float(np.max(np.abs(r64))) if r64.size else 0.0
        diff = np.abs(g64 - r64).reshape(n, -1).max(axis=1) if r64.size else np.zeros(n)
        per = diff / scale if scale > 0 else diff
        c = smoke.check_output(spec.name, kinds[spec.name], r64, g64, tol, precision)
        entry: dict[str, Any] = {
            "kind": kinds[spec.name], "state": spec.name in states, "passed": bool(c["passed"]),
            "max_rel_error": float(c["max_rel_error"]), "max_abs_error": float(c["max_abs_error"]),
            "tolerance_rel": float(c["tolerance_rel"]), "worst_chunk": c["worst_sample"],
            "first_chunk_rel_error": float(per[0]), "last_chunk_rel_error": float(per[-1]),
            "first_quarter_mean_rel_error": _quarter(per, False), "last_quarter_mean_rel_error": _quarter(per, True),
            "per_chunk_rel_error": [float(x) for x in per]}
        for k in ("top1_agreement", "snr_db", "cosine"):
            if c.get(k) is not None and np.isfinite(c[k]):
                entry[k] = float(c[k])
        if kinds[spec.name] == "class" and r64.ndim >= 2:
            flips = np.argmax(r64.reshape(n, -1), axis=1) != np.argmax(g64.reshape(n, -1), axis=1)
            entry["disagreeing_chunks"] = [int(k) for k in np.flatnonzero(flips)]
        record["outputs"][spec.name] = entry
        failures += [f"carried state over {n} chunks: " + f.replace("golden sample", "chunk").replace("golden ", "")
                     for f in c["failures"]]
    record["passed"] = not failures
    return record, failures


def summary(record: dict[str, Any]) -> str:
    """One line: the carried run's error at the first and the last chunk, per output."""
    parts = [f"{name} {o['first_chunk_rel_error']:.2e} -> {o['last_chunk_rel_error']:.2e} (max {o['max_rel_error']:.2e}"
             + (f", top-1 {o['top1_agreement']:.0%}" if "top1_agreement" in o else "") + ")"
             for name, o in record["outputs"].items()]
    return (f"carried state over {record['chunks']} chunks, each model its own (error at the first -> last chunk, "
            "of the output's range): " + "; ".join(parts))
