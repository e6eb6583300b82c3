"""Fine-tune lineage: what a ``.pt2`` that ``edgekit finetune`` wrote carries, and what convert does with it.

The trainer (edgekit.finetune) saves a record (:data:`RECORD`, a JSON file inside the ``.pt2``: torch.export.save
extra_files) with the float model it came from (path, sha256), the recipe, each training sample's fingerprint
(:func:`sample_digests`) and the activation ranges its student held. Convert reads it (:func:`read_record`) to show
the origin in the manifest (:func:`finetuned`), to measure the build against that original float model
(:func:`original_reference`, :func:`against_original`), to say which eval samples training saw, and, on jetson with
``--option student_ranges=on``, to impose the student's ranges on the tensors that hold the same values
(:func:`student_ranges`). Nothing here trains: the student's graph is rebuilt with edgekit.fakequant.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit.data import Dataset
from edgekit.deps import require
from edgekit.fakequant import (
    SYMMETRIC_ACTS,
    act_fqs,
    fold_batch_norms,
    graph_module,
    insert_fake_quant,
    set_mode,
    uncapture,
)
from edgekit.fsutil import sha256_file
from edgekit.ingest import KERAS_SUFFIXES, Model, load_model

if TYPE_CHECKING:
    from edgekit.converters import Runner
    from edgekit.profiles import Tolerance
    from edgekit.stages import Prepared
    from edgekit.verify import Verification

RECORD = "edgekit-finetune.json"  # the recipe, inside the written .pt2 (torch.export.save extra_files)


def read_record(path: str | Path) -> dict[str, Any] | None:
    """The finetune record inside a ``.pt2`` that ``edgekit finetune`` wrote, or None."""
    try:
        with zipfile.ZipFile(path) as zf:
            name = next((n for n in zf.namelist() if n.endswith("extra/" + RECORD)), None)
            return json.loads(zf.read(name)) if name else None
    except (OSError, zipfile.BadZipFile, ValueError):
        return None


def data_digest(ds: Dataset, model: Model) -> str:
    """The sha256 of all the data's input arrays, in the model's input order: a resume checks the same data."""
    import hashlib

    h = hashlib.sha256()
    for s in model.inputs:
        h.update(np.ascontiguousarray(ds.inputs[s.name]).tobytes())
    return h.hexdigest()


SAMPLE_DIGESTS_MAX = 100_000  # 17 bytes each in the record; convert's held-out check reads them


def sample_digests(ds: Dataset, model: Model) -> list[str]:
    """Each sample's fingerprint (the first 16 hex digits of the sha256 of its input arrays, in the model's input
    order): convert tells from the record's list whether its eval samples were among the fine-tuning data."""
    import hashlib

    arrays = [np.ascontiguousarray(ds.inputs[s.name], dtype=s.dtype) for s in model.inputs]
    out = []
    for i in range(min(len(ds), SAMPLE_DIGESTS_MAX)):
        h = hashlib.sha256()
        for a in arrays:
            h.update(a[i].tobytes())
        out.append(h.hexdigest()[:16])
    return out


STUDENT_MATCH_RTOL = 1e-3  # a student point's input and an ONNX tensor are the same where they agree to this ...
STUDENT_MATCH_ATOL = 1e-4  # ... and this share of the point's largest |x|, on one calibration batch


def student_ranges(model: Model, onnx_model: str | Path, feed: dict[str, np.ndarray],
                   quantized: tuple[str, ...]) -> dict[str, Any] | None:
    """The activation ranges a jetson student trained with, for the tensors of ``onnx_model`` (the fine-tuned
    ``.pt2`` exported to ONNX) that hold the same values; None where ``model`` is not a .pt2 finetune wrote.

    The record lists one range per fake-quant point in the order edgekit.fakequant's :func:`insert_fake_quant`
    makes them. The student's graph is rebuilt from the fine-tuned program the same way and checked against the
    record (as many points); each point's input, on ``feed`` (one calibration batch), is matched by value to the ONNX
    model's inputs of the ops TensorRT quantizes (``quantized``: the tensorrt converter's TRT_QDQ_OPS). Values, not
    names or weights: the ONNX export renames tensors and may fold a scale into a weight (a squeeze-excite
    convolution's). An equalized tensor holds other values and is not matched. Returns
    ``{"ranges": {tensor: (lo, hi)}, "points": N, "matched": k}``, or a ``reason``."""
    if model.kind != "exported_program":
        return None
    rec = read_record(model.source)
    if not isinstance(rec, dict) or not isinstance(rec.get("finetuned_from"), dict):
        return None
    recipe = rec.get("recipe") if isinstance(rec.get("recipe"), dict) else {}
    if recipe.get("target") != "jetson" or recipe.get("prune"):
        return {"ranges": {}, "points": 0, "matched": 0,
                "reason": (f"fine-tuned for {recipe['target']!r}" if recipe.get("target") else "the record names no "
                           "target") + (" with pruning" if recipe.get("prune") else "") + ", not jetson: the "
                          "activations are calibrated here"}
    saved = rec.get("activation_ranges")
    if not isinstance(saved, list) or not all(isinstance(r, list) and len(r) == 2 and all(
            isinstance(v, (int, float)) and np.isfinite(v) for v in r) for r in saved):
        return {"ranges": {}, "points": 0, "matched": 0, "reason": "the record holds no usable activation ranges"}
    torch = require("torch")
    onnx = require("onnx", "jetson")
    from edgekit.onnx_graph import tensor_values

    gm = graph_module(model)
    fold_batch_norms(gm)
    insert_fake_quant(gm, SYMMETRIC_ACTS["jetson"], inputs_only=True)
    points = act_fqs(gm)
    if len(points) != len(saved):
        return {"ranges": {}, "points": len(saved), "matched": 0,
                "reason": f"the program has {len(points)} quantized activations, the record {len(saved)}"}
    for a in points:  # each point's own list: the order they run in need not be the order they were made in
        a.capture = []
    set_mode(gm, "off")
    try:
        with torch.no_grad():  # one calibration batch, of the shape the program takes
            gm(*(torch.from_numpy(np.asarray(feed[s.name])) for s in model.inputs))
    except Exception as exc:  # noqa: BLE001 - torch raises many types; the build then calibrates as any model's
        return {"ranges": {}, "points": len(saved), "matched": 0, "reason": "the student's graph did not run on a "
                f"calibration batch ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"}
    values = [np.asarray(a.capture[0].detach().float().numpy()) if a.capture else None for a in points]
    uncapture(gm)
    proto = onnx.load(str(onnx_model))
    consts = {i.name for i in proto.graph.initializer}
    names = list(dict.fromkeys(t for n in proto.graph.node if n.op_type in quantized
                               for t in n.input[:2 if n.op_type == "MatMul" else 1] if t and t not in consts))
    got = tensor_values(proto, names)(feed)
    ranges: dict[str, tuple[float, float]] = {}
    matched = 0
    for v, (lo, hi) in zip(values, saved, strict=True):
        same = [] if v is None else [t for t, o in got.items() if o.shape == v.shape and np.allclose(
            o, v, rtol=STUDENT_MATCH_RTOL, atol=STUDENT_MATCH_ATOL * max(float(np.abs(v).max()), 1e-12))]
        for t in same:
            ranges[t] = (float(lo), float(hi))
        matched += bool(same)
    return {"ranges": ranges, "points": len(saved), "matched": matched}


def finetuned(m: Model) -> dict[str, Any]:
    """A .pt2 that `edgekit finetune` wrote carries its origin and recipe: the manifest shows them."""
    if m.kind != "exported_program":
        return {}
    rec = read_record(m.source)
    origin = rec.get("finetuned_from") if isinstance(rec, dict) else None
    if not isinstance(origin, dict):
        return {}
    # the record comes from the file: its fields are written as text, whatever their type there
    return {"finetuned_from": {**{k: str(v) for k, v in origin.items()},
                               "recipe": rec["recipe"] if isinstance(rec.get("recipe"), dict) else {}}}


def original_reference(m: Model) -> tuple[tuple[Callable, str] | None, str]:
    """For a ``.pt2`` that `edgekit finetune` wrote: the float model it came from (found and checked as
    :func:`_original` does) as a runner taking this model's feeds (inputs by position: names may differ), and its
    source; (None, why) where there is none to use."""
    rec = read_record(m.source) if m.kind == "exported_program" else None
    if not isinstance(rec, dict) or not isinstance(rec.get("finetuned_from"), dict):
        return None, "not a model edgekit finetune wrote"
    orig, why = _original(rec["finetuned_from"], m)
    if orig is None:
        return None, why
    if len(orig.inputs) != len(m.inputs) or len(orig.outputs) != len(m.outputs):
        return None, (f"{orig.source} has {len(orig.inputs)} input(s) and {len(orig.outputs)} output(s), this model "
                      f"{len(m.inputs)} and {len(m.outputs)}")
    run_orig, names = orig.reference(), [s.name for s in orig.inputs]

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return run_orig({n: feeds[s.name] for n, s in zip(names, m.inputs, strict=True)})

    return (reference, orig.source), ""


def student_reference(m: Model, artifact_meta: dict[str, Any],
                      warn: Callable[[str], None]) -> tuple[Callable, str] | None:
    """What a build is verified against: for one that imposes its fine-tuned student's activation ranges, the float
    model it was fine-tuned from (:func:`original_reference`), since that is what it imitates; None otherwise (its
    own float weights), with a warning where that original is not there."""
    if not ((artifact_meta.get("quantization") or {}).get("student_ranges") or {}).get("applied"):
        return None
    reference, why = original_reference(m)
    if reference is None:
        warn(f"the build imposes its fine-tuned student's activation ranges, but the float model it was fine-tuned "
             f"from is not there to check it against ({why}): checked against its own float weights, which it does "
             "not imitate; --option student_ranges=off calibrates")
    return reference


# the files a record may name as the original: formats edgekit reads without running code from them (a Keras file
# in Keras' safe mode: no Lambda bytecode), never a pickle or a factory
ORIGINAL_SUFFIXES = (".pt2", ".onnx", *KERAS_SUFFIXES)
_ORIGINAL_METRICS = ("top1_agreement", "disagreements", "snr_db", "cosine", "iou", "text_agreement", "cer",
                     "max_rel_error")


def against_original(m: Model, make_runner: Callable[[], Runner], comp: Prepared, tol: Tolerance, precision: str,
                     v: Verification, original: tuple[Callable, str] | None = None) -> None:
    """A ``.pt2`` that `edgekit finetune` wrote is verified against its own fine-tuned float weights; the model the
    user means to ship is the float model it came from. So the final build (once, after any mixed-precision
    rebuilds) is measured against that one too, on the eval (else golden) samples, reported in
    ``v.against_original`` and a note, not gating. The record's sample fingerprints tell which of those samples the
    fine-tuning trained on (then the agreement is not held out). Only a model file (:data:`ORIGINAL_SUFFIXES`) at
    the recorded path with the recorded sha256 is read: a record in a file names no code to run. ``original``: that
    model as :func:`original_reference` gives it, where the caller has it already (the gate's reference)."""
    from edgekit.verify import output_checks, run_pair

    if m.kind != "exported_program" or not v.outputs:  # not fine-tuned, or the artifact did not run
        return
    rec = read_record(m.source)
    if not isinstance(rec, dict) or not isinstance(rec.get("finetuned_from"), dict):
        return
    data, what = (comp.eval, "eval") if comp.eval is not None else (comp.golden, "golden")
    samples = rec.get("data_samples")
    seen = {d for d in samples if isinstance(d, str)} if isinstance(samples, list) else set()
    trained_on = sum(d in seen for d in sample_digests(data, m)) if seen else 0
    if trained_on:
        v.notes.append(f"{trained_on} of the {len(data)} {what} samples were among the samples edgekit finetune "
                       "trained on: agreement on them is not held out; give --eval samples it did not see")
    found, why = (original, "") if original else original_reference(m)
    if found is None:
        v.notes.append(f"agreement with the float model it was fine-tuned from not measured: {why}")
        return
    reference, source = found
    try:
        ref, got, _ = run_pair(reference, make_runner(), list(data.batches(m)))
    except Exception as exc:  # noqa: BLE001 - the original's runtime raises its own types
        v.notes.append(f"agreement with the float model it was fine-tuned from not measured: {source} does "
                       f"not run on these inputs ({type(exc).__name__}: {str(exc)[:160]})")
        return
    smoke, tol_d, outputs = output_checks(), tol.model_dump(), {}
    for spec, r, g in zip(m.outputs, ref, got, strict=True):
        c = smoke.check_output(spec.name, comp.kinds[spec.name], r, g, tol_d, precision)
        outputs[spec.name] = {k: float(c[k]) for k in _ORIGINAL_METRICS if c.get(k) is not None and np.isfinite(c[k])}
    n = len(ref[0])
    said = []
    for name, o in outputs.items():
        if "top1_agreement" in o:
            said.append(f"output {name!r}: top-1 agrees on {o['top1_agreement']:.1%}")
        elif "snr_db" in o:
            said.append(f"output {name!r}: SNR {o['snr_db']:.1f} dB")
    summary = (f"against the float model it was fine-tuned from ({source}), on {n} {what} samples: "
               + ("; ".join(said) or "no decision or SNR to compare")
               + (f" ({trained_on} of them seen in fine-tuning)" if trained_on else ""))
    v.notes.append(summary)
    v.against_original = {"model": source, "sha256": str(rec["finetuned_from"]["sha256"]), "samples": n, "from": what,
                          "trained_on": trained_on, "outputs": outputs, "summary": summary}


def _original(origin: dict[str, Any], m: Model) -> tuple[Model | None, str]:
    """The float model a fine-tuned ``.pt2`` came from, found at its recorded path (absolute, else as written) and
    checked by sha256; (None, why) where it is not there, not a model file, or changed."""
    sha = str(origin.get("sha256") or "")
    paths = [Path(str(p)) for p in (origin.get("abspath"), origin.get("path")) if p]
    found = next((p for p in paths if p.suffix in ORIGINAL_SUFFIXES and p.is_file()), None)
    if found is None:
        return None, (f"{origin.get('path')} is not there (or not a {' / '.join(ORIGINAL_SUFFIXES)} file); keep it "
                      "where it was, or convert the float model for the comparison")
    now = sha256_file(found)
    if now != sha:
        return None, f"{found} changed since fine-tuning (sha256 {now[:12]}…, recorded {sha[:12]}…)"
    shapes = None if found.suffix == ".pt2" else [",".join(map(str, s.shape)) for s in m.inputs]
    try:
        return load_model(found, shapes), ""
    except Exception as exc:  # noqa: BLE001 - a model that no longer loads is reported, not raised
        return None, f"{found} does not load ({type(exc).__name__}: {str(exc)[:160]})"
