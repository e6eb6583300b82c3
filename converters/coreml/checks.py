"""What Linux can check in a saved ``.mlpackage`` without Core ML: the spec loads back, its inputs and outputs
match the source model, and its weight file takes the bytes the requested compression should (the MIL program
read by :mod:`edgekit.converters.coreml.mil`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.coreml import mil as cm
from edgekit.converters.coreml.compression import Compression
from edgekit.converters.coreml.mlprogram import coreml_dtype, coreml_names
from edgekit.errors import ConversionError


def linux_checks(job: ConvertJob, pkg: Path, comp: Compression, threshold: int, mixed: bool = False,
                 consumers: frozenset[str] | None = None, kept_layers: int = 0) -> dict[str, Any]:
    """Static checks of the saved package; raises ConversionError where it does not match the request."""
    try:
        sig = cm.io_signature(pkg)
        raw = cm.load_program(pkg, decompress=False)
        dense = cm.load_program(pkg, decompress=True)
    except Exception as exc:
        raise ConversionError(f"{pkg}: the saved package does not load back ({type(exc).__name__}: {exc})") from None
    problems = []
    rn = coreml_names([s.name for s in job.model.inputs + job.model.outputs])
    for kind, specs in (("input", job.model.inputs), ("output", job.model.outputs)):
        got = sig[f"{kind}s"]
        want = [{"name": rn[s.name], "shape": list(s.shape), "dtype": coreml_dtype(s.dtype)} for s in specs]
        if [(g["name"], g["shape"], g["dtype"]) for g in got] != [(w["name"], w["shape"], w["dtype"]) for w in want]:
            problems.append(f"{kind}s are {got}, the source model has {want}")
    weights = weight_bytes(raw, dense, pkg, comp, threshold, job.precision, mixed, consumers, kept_layers)
    problems += weights.pop("problems")
    if problems:
        raise ConversionError(f"{pkg.name} does not match the request: " + "; ".join(problems))
    return {
        "spec_loads": True,
        "spec_version": sig["spec_version"],
        "io": {"inputs": sig["inputs"], "outputs": sig["outputs"], "matches_source": True},
        "op_counts": cm.op_counts(raw),
        "ane_flags": cm.ane_flags(raw, "fp32" if job.precision == "fp32" else "fp16"),
        "weights": weights,
    }


def weight_bytes(raw, dense, pkg: Path, comp: Compression, threshold: int, precision: str,
                 mixed: bool = False, consumers: frozenset[str] | None = None, kept_layers: int = 0) -> dict[str, Any]:
    """Measured weight-file bytes against what the requested compression should take. ``kept_layers``: layers
    a mixed-precision W8A8 build leaves fp16 on purpose; up to that many eligible weights may stay uncompressed."""
    elem_bytes = 4 if precision == "fp32" else 2
    weights = cm.float_weights(dense)
    compressed = cm.compressed_weights(raw)
    eligible = [w for w in weights if int(np.prod(w[1])) >= threshold and (consumers is None or w[2] in consumers)
                ] if comp.method else []
    if kept_layers and eligible:  # the kept layers' weights are plain fp16 consts in the stored program
        plain = {w[0] for w in cm.float_weights(raw) if consumers is None or w[2] in consumers}
        if len([w for w in eligible if w[0] in plain]) <= kept_layers:
            eligible = [w for w in eligible if w[0] not in plain]
    n_all = sum(int(np.prod(s)) for _, s, _ in weights)
    n_elig = sum(int(np.prod(s)) for _, s, _ in eligible)
    # every other float const (biases, small weights, ...) is stored at the compute precision
    n_other_consts = sum(
        int(np.asarray(op.val.val).size) for op in dense.functions["main"].operations
        if op.op_type == "const" and isinstance(op.val.val, np.ndarray) and op.val.val.dtype.kind == "f"
    ) - n_elig
    expected_data = n_elig * comp.bits / 8 + n_other_consts * elem_bytes
    if mixed:  # ops kept fp32 in an fp16 program keep their consts fp32: count each const at its stored dtype
        expected_data = n_elig * comp.bits / 8 + sum(
            int(np.asarray(op.val.val).size) * np.asarray(op.val.val).dtype.itemsize
            for op in raw.functions["main"].operations
            if op.op_type == "const" and isinstance(op.val.val, np.ndarray) and op.val.val.dtype.kind == "f")
    blobs = sum(1 for op in raw.functions["main"].operations
                if op.op_type == "const" and isinstance(op.val.val, np.ndarray) and op.val.val.size >= 2)
    overhead = 64 + 128 * blobs  # file header; per blob a 64-byte header and 64-byte alignment
    if comp.method == "palettize":
        overhead += len(eligible) * (2 ** int(comp.bits)) * elem_bytes  # one LUT per tensor
    if comp.method == "linear":
        overhead += sum(int(s[0]) for _, s, _ in eligible) * 3  # per-channel scale (fp16) + zero point
    measured = cm.weight_bin_bytes(pkg)
    problems = []
    if measured > expected_data * 1.1 + overhead or measured < expected_data * 0.9:
        problems.append(
            f"weight file is {measured:,} bytes, {precision} should take about {int(expected_data):,} "
            f"(+ up to {overhead:,} bytes of headers/alignment)"
        )
    want_ops = cm.COMPRESSION_OPS.get(comp.method or "", ())
    if comp.method in cm.COMPRESSION_OPS:
        n_compressed = sum(1 for v in compressed.values() if v in want_ops)
        if n_compressed < len(eligible):
            problems.append(f"only {n_compressed} of {len(eligible)} weights >= {threshold} elements are stored "
                            f"as {'/'.join(want_ops)}")
    other_bytes = n_other_consts * elem_bytes
    return {
        "measured_bytes": measured,
        "expected_bytes": int(expected_data),
        "allowed_overhead_bytes": overhead,
        "fp32_weight_bytes": 4 * n_all,  # conv/linear weights only
        "fp32_bytes": 4 * (n_elig + n_other_consts),  # every float const: weights and biases
        "weight_tensors": len(weights),
        "compressed_tensors": len(eligible),
        "compressed_elements": n_elig,
        "compressed_ratio_vs_fp32": round((measured - other_bytes) / (4 * n_elig), 4) if n_elig else None,
        "file_ratio_vs_fp32_weights": round(measured / (4 * n_all), 4) if n_all else None,
        "storage": {k: v for k, v in sorted(Counter(compressed.values()).items())},
        "problems": problems,
    }
