"""What Linux can read in a Core ML ML program without Core ML: the static checks.

Core ML's ``predict`` exists only on macOS. On Linux coremltools still reads the package (spec, MIL program,
weight blobs, ``decompress_weights``): ``program_ops`` / ``op_counts``, ``io_signature``, the float and the
compressed weights, ``weight_bin_bytes`` and ``ane_flags`` come from that. The program runs in torch in
:mod:`edgekit.converters.coreml.interpreter`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

# Ops that are known to keep a model (or a segment of it) off the Apple Neural Engine, so
# Core ML runs them on the GPU or CPU. Heuristics, not a guarantee: Apple publishes no
# list. Sources: Apple, "Deploying Transformers on the Apple Neural Engine" (2022);
# coremltools docs "Typed Execution" (ANE computes in fp16 only); community op table
# github.com/hollance/neural-engine ("Unsupported layers"); Core ML's MLComputePlan on
# macOS gives the real per-op device (run firmware/coreml/run.py --compute-plan there).
ANE_UNFRIENDLY_OPS: dict[str, str] = {
    "gather": "dynamic indexing runs on CPU",
    "gather_nd": "dynamic indexing runs on CPU",
    "gather_along_axis": "dynamic indexing runs on CPU",
    "scatter": "scatter runs on CPU",
    "scatter_nd": "scatter runs on CPU",
    "scatter_along_axis": "scatter runs on CPU",
    "non_maximum_suppression": "NMS runs on CPU",
    "topk": "top-k runs on CPU",
    "argsort": "sort runs on CPU",
    "cumsum": "cumulative sum runs on CPU/GPU",
    "random_uniform": "random ops run on CPU",
    "random_normal": "random ops run on CPU",
    "random_bernoulli": "random ops run on CPU",
    "random_categorical": "random ops run on CPU",
    "while_loop": "control flow splits the model off the ANE",
    "cond": "control flow splits the model off the ANE",
    "einsum": "general einsum runs on GPU/CPU",
    "non_zero": "data-dependent shapes run on CPU",
    "band_part": "runs on GPU/CPU",
    "einsum_general": "runs on GPU/CPU",
}
ANE_MAX_DIM = 16384  # tensors with a dimension above 16384 do not run on the ANE (hollance/neural-engine)

# constexpr op that holds a weight compressed by each coremltools.optimize.coreml method
COMPRESSION_OPS = {
    "linear": ("constexpr_affine_dequantize", "constexpr_blockwise_shift_scale"),
    "palettize": ("constexpr_lut_to_dense",),
    "prune": ("constexpr_sparse_to_dense",),
}
WEIGHT_CONSUMERS = {"conv", "conv_transpose", "linear", "matmul"}


def load_program(package: Path, decompress: bool) -> Any:
    """The MIL program of a saved ``.mlpackage`` (compressed weights expanded if asked)."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    model = ct.models.MLModel(str(package), skip_model_load=True)
    if decompress:
        from coremltools.optimize.coreml import decompress_weights

        return decompress_weights(model)._mil_program
    spec = model.get_spec()
    return milproto_load(spec, specification_version=spec.specificationVersion, file_weights_dir=model.weights_dir)


def main_function(prog: Any) -> Any:
    return prog.functions["main"]


def program_ops(prog: Any) -> list[str]:
    return [op.op_type for op in main_function(prog).operations]


def op_counts(prog: Any) -> dict[str, int]:
    return dict(sorted(Counter(program_ops(prog)).items()))


def weight_bin_bytes(package: Path) -> int:
    """Bytes of the package's weight blob file(s)."""
    wdir = Path(package) / "Data" / "com.apple.CoreML" / "weights"
    return sum(p.stat().st_size for p in wdir.glob("*") if p.is_file()) if wdir.is_dir() else 0


def float_weights(prog: Any, min_size: int = 1) -> list[tuple[str, tuple[int, ...], str]]:
    """Float consts feeding a weight input of conv/linear/matmul: (name, shape, consumer op)."""
    out = []
    for op in main_function(prog).operations:
        if op.op_type not in WEIGHT_CONSUMERS:
            continue
        for key in ("weight", "y"):
            var = op.inputs.get(key)
            if var is None or var.op is None:
                continue
            val = var.val
            if val is None or not isinstance(val, np.ndarray) or val.dtype.kind != "f" or val.size < min_size:
                continue
            out.append((var.op.name, tuple(val.shape), op.op_type))
    return out


def compressed_weights(prog: Any) -> dict[str, str]:
    """Weight inputs of conv/linear/matmul in a (not decompressed) program -> constexpr op type."""
    out = {}
    for op in main_function(prog).operations:
        if op.op_type not in WEIGHT_CONSUMERS:
            continue
        for key in ("weight", "y"):
            var = op.inputs.get(key)
            if var is not None and var.op is not None and var.op.op_type == "cast":
                var = var.op.inputs.get("x")  # stored compressed, cast for a consumer kept fp32
            if var is not None and var.op is not None and var.op.op_type.startswith("constexpr_"):
                out[f"{op.name}.{key}"] = var.op.op_type
    return out


def io_signature(package: Path) -> dict[str, list[dict[str, Any]]]:
    """Input/output names, shapes and types from the package's spec."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(package))
    from coremltools.proto import FeatureTypes_pb2 as ft

    names = {v: k for k, v in ft.ArrayFeatureType.ArrayDataType.items()}

    def one(desc) -> dict[str, Any]:
        arr = desc.type.multiArrayType
        return {"name": desc.name, "shape": [int(d) for d in arr.shape],
                "dtype": {"FLOAT32": "float32", "FLOAT16": "float16", "INT32": "int32", "DOUBLE": "float64"}.get(
                    names.get(arr.dataType, "?"), names.get(arr.dataType, "?"))}

    return {"inputs": [one(d) for d in spec.description.input], "outputs": [one(d) for d in spec.description.output],
            "spec_version": spec.specificationVersion}


def ane_flags(prog: Any, compute_precision: str) -> list[str]:
    flags = []
    if compute_precision == "fp32":
        flags.append("compute precision fp32: the Neural Engine computes in fp16 only, so Core ML runs this model "
                     "on the GPU/CPU; convert with fp16 (or a compressed precision) to use the ANE")
    for op in main_function(prog).operations:
        if op.op_type in ANE_UNFRIENDLY_OPS:
            flags.append(f"op {op.op_type} ({op.name}): {ANE_UNFRIENDLY_OPS[op.op_type]}")
        if op.op_type.startswith("const"):
            continue  # weights (and packed compressed indices) are not activations
        for out in op.outputs:
            shape = getattr(out, "shape", None) or ()
            big = [d for d in shape if isinstance(d, int) and d > ANE_MAX_DIM]
            if big:
                flags.append(f"op {op.op_type} ({op.name}): output dimension {big[0]} > {ANE_MAX_DIM} (ANE limit)")
    return flags
