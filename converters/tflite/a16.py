"""The 16x8 build (``--option activations=int16``): the fp32 .tflite quantized by ai-edge-quantizer's
``static_wi8_ai16`` recipe (int8 per-channel weights, int16 symmetric activations) with min/max ranges over every
--calib batch; ops LiteRT's int16 kernels refuse to prepare are kept float, one at a time."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.tflite.audit import short_node
from edgekit.converters.tflite.build import float_reference
from edgekit.converters.tflite.interpreter import interpreter, refused_node
from edgekit.converters.tflite.options import EXTRA
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError, InputSpecError
from edgekit.quiet import quiet_python
from edgekit.tflite_graph import TFLiteGraph

# ops a LiteRT int16 kernel refuses to prepare are kept float one at a time, at most this many
A16_KERNEL_RETRIES = 8


def _scope_regex(tensor: str) -> str:
    """ai-edge-quantizer's recipe regex for the op writing ``tensor``: it matches an op's scope, its output tensor
    names each followed by ";" (``tfl_flatbuffer_utils.get_op_scope``)."""
    return "(^|;)" + re.escape(tensor) + ";"


def _a16_recipe() -> Any:
    return require("ai_edge_quantizer.recipe", EXTRA).static_wi8_ai16()


@contextlib.contextmanager
def _aeq_errors(m: Any, verb: str) -> Iterator[None]:
    """ai-edge-quantizer raises many types on an op or graph it does not take: one ConversionError naming what it
    could not do (``verb``: calibrate, write) and the fix; edgekit's own errors pass through."""
    try:
        yield
    except (InputSpecError, ConversionError):
        raise
    except Exception as exc:
        raise ConversionError(f"{m.source}: ai-edge-quantizer could not {verb} the 16x8 model "
                              f"({type(exc).__name__}: {str(exc)[:300]}); use the int8 build (leave "
                              "--option activations out)") from None


@dataclass
class A16:
    """What every 16x8 build of one model shares: the fp32 .tflite, its ai-edge-quantizer, the calibration ranges,
    and the ops LiteRT's int16 kernels refused (kept float in every later build)."""
    src: Path
    q: Any
    ranges: dict[str, Any]
    n_batches: int
    outputs: set[str]  # every op's output tensor name in the fp32 .tflite (what keep_float_tensors may name)
    refusals: list[tuple[str, Any]] = field(default_factory=list)  # (tensor regex, op) recipe entries, no_quantize
    float_for_kernels: list[str] = field(default_factory=list)



def a16_build(job: ConvertJob, dest: Path, layout: str) -> dict[str, Any]:
    """``activations=int16``: the fp32 .tflite (:func:`~edgekit.converters.tflite.build.float_tflite`), then
    ai-edge-quantizer's ``static_wi8_ai16`` recipe: int8 per-channel weights, int16 symmetric per-tensor
    activations. Ranges are the min and max over every --calib batch: ai-edge-quantizer's own calibration keeps a
    moving average of each batch's min/max (smoothing 0.95), which ends inside the data's range and clips the
    values beyond it. Ops named in ``keep_float_tensors`` stay float. Returns the quantization record."""
    a = a16_source(job, layout)
    kept = list(job.options.get("keep_float_tensors") or [])
    a16_write(job, a, dest, kept)
    job.log(f"16-bit activations: ai-edge-quantizer static_wi8_ai16, min/max ranges over {a.n_batches} batches"
            + (f"; {len(kept)} op(s) kept float" if kept else ""))
    aeq = toolchain_versions("ai-edge-quantizer").get("ai-edge-quantizer", "?")
    info = {
        "tool": f"ai-edge-quantizer {aeq} static_wi8_ai16 (TFLite 16x8)",
        "weights": "int8 symmetric per-channel", "activations": "int16 symmetric per-tensor (min/max)",
        "io": "int16", "calibration_method": "minmax", "calibration_chosen": "min/max over every batch (16 bits "
        "leave room for the whole range)", "calibration_batches": a.n_batches,
        "calibration_source": job.calib.source, "activation_bits": 16,
    }
    if a.float_for_kernels:
        info["float_for_litert_int16_kernels"] = list(a.float_for_kernels)
    if kept:
        info["keep_float_tensors"] = kept
    return info


def a16_source(job: ConvertJob, layout: str) -> A16:
    """The fp32 .tflite, its ai-edge-quantizer and the calibration ranges: made once per model and layout,
    reused by the 16x8 layer search's builds (each then only quantizes)."""
    if f"a16-{layout}" in job.cache:
        return job.cache[f"a16-{layout}"]
    m = job.model
    aq = require("ai_edge_quantizer.quantizer", EXTRA)
    src = float_reference(job, layout)
    with _aeq_errors(m, "calibrate"):
        interp = interpreter(src, 1)
        sig = next(iter(interp.get_signature_list()))
        by_index = {d["index"]: name for name, d in interp.get_signature_runner(sig).get_input_details().items()}
        sig_names = [by_index[d["index"]] for d in interp.get_input_details()]  # in the model's input order
        q = aq.Quantizer(str(src))
        q.load_quantization_recipe(_a16_recipe())
        ranges, n_batches = _a16_ranges(job, q, sig, sig_names, layout)
    if n_batches == 0:
        raise InputSpecError(f"--calib {job.calib.source}: no batch of {m.batch} samples in it")
    g = TFLiteGraph(src)
    outputs = {g.tensor_name(o[2][0]) for o in g.operators() if o[2]}
    a = A16(src, q, ranges, n_batches, outputs)
    job.cache[f"a16-{layout}"] = a
    return a


def a16_write(job: ConvertJob, a: A16, dest: Path, kept: list[str]) -> None:
    """The 16x8 model at ``dest`` with the ops whose output tensors are ``kept`` float. Ops LiteRT's int16
    kernels refuse to prepare are kept float too and it is quantized again (remembered for later builds)."""
    m = job.model
    qtyping = require("ai_edge_quantizer.qtyping", EXTRA)
    unknown = [t for t in kept if t not in a.outputs]
    if unknown:
        raise ConversionError(f"--option keep_float_tensors: no op of the fp32 .tflite writes "
                              f"{', '.join(map(repr, unknown[:5]))}; name ops by their output tensor (the 16x8 "
                              "build's report lists them)")
    with _aeq_errors(m, "write"):
        a.q.load_quantization_recipe(_a16_recipe())
        for regex, op in a.refusals:
            a.q.update_quantization_recipe(regex=regex, operation_name=op, algorithm_key="no_quantize")
        for t in kept:
            a.q.update_quantization_recipe(regex=_scope_regex(t), operation_name="*",
                                           algorithm_key="no_quantize")
        for _ in range(A16_KERNEL_RETRIES + 1):
            with job.substep("16x8 quantization"), quiet_python():
                res = a.q.quantize(a.ranges)
            dest.write_bytes(bytes(res.quantized_model))
            refused = refused_node(dest)
            if refused is None:
                break
            # LiteRT's int16 kernels check more than ai-edge-quantizer does (an ADD of two int16 inputs whose
            # scales its general path cannot rescale): that op stays float, quantize again
            op, tensor, why = refused
            if len(a.float_for_kernels) == A16_KERNEL_RETRIES:
                raise ConversionError(f"{m.source}: the 16x8 model does not load in LiteRT: {op} ({why}), "
                                      f"after {A16_KERNEL_RETRIES} ops were kept float for the same reason")
            if any(f.startswith(op + " ") for f in a.float_for_kernels):  # again: every op of that kind float
                a.float_for_kernels.append(f"{op} (every one: {why})")
                job.log(f"16x8: LiteRT's int16 {op} kernel refuses a second node ({why}); every {op} kept float")
                a.refusals.append((".*", qtyping.TFLOperationName(op)))
            else:
                a.float_for_kernels.append(f"{op} ({short_node(tensor, 60)}: {why})")
                job.log(f"16x8: LiteRT's int16 {op} kernel refuses node {tensor!r} ({why}); kept float")
                a.refusals.append((_scope_regex(tensor), "*"))
            a.q.update_quantization_recipe(regex=a.refusals[-1][0], operation_name=a.refusals[-1][1],
                                           algorithm_key="no_quantize")


def _a16_ranges(job: ConvertJob, q: Any, key: str, sig_names: list[str], layout: str) -> tuple[dict, int]:
    """Each tensor's min and max over every --calib batch (one ai-edge-quantizer calibration per batch)."""
    m = job.model
    ranges: dict[str, Any] = {}
    n_batches = 0
    assert job.calib is not None  # the pipeline refuses int8 without --calib
    with job.substep("calibration (16-bit activations)"), quiet_python():
        for feed in job.calib.batches(m):
            sig_feed = {}
            for name, spec in zip(sig_names, m.inputs, strict=True):
                x = np.ascontiguousarray(feed[spec.name], dtype=np.float32)
                sig_feed[name] = x.transpose(0, 2, 3, 1) if layout == "nhwc" and x.ndim == 4 else x
            one = q.calibrate({key: [sig_feed]})
            n_batches += 1
            for t, v in one.items():
                if t in ranges and "min" in v and "max" in v:
                    v = {**ranges[t], "min": np.minimum(ranges[t]["min"], v["min"]),
                         "max": np.maximum(ranges[t]["max"], v["max"])}
                ranges[t] = v
    return ranges, n_batches
