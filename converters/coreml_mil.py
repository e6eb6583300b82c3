"""What Linux can check in a Core ML ML program, without Core ML.

Core ML's ``predict`` exists only on macOS. On Linux coremltools still reads the package
(spec, MIL program, weight blobs, ``decompress_weights``). This module uses that to:

- ``MILInterpreter``: run the *decompressed* MIL program of a package with torch
  kernels, fp32 arithmetic, rounding each tensor the program stores as fp16 to fp16.
  It checks the converted graph and the compressed weights read back from the package;
  it does not reproduce Core ML's own fp16 arithmetic (accumulation order, ANE
  fixed-point details), so its numbers measure the weight compression, not the device.
- ``program_ops``/``io_signature``/``weight_report``/``ane_flags``: the static checks.

The interpreter covers the ops coremltools writes for CNN classifiers (conv, pooling,
normalisation, activations, elementwise, reductions, reshapes, linear/matmul). Any other
op is a :class:`VerificationError` naming the op, so a model outside that set is
reported as "verify on macOS", never silently skipped.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import VerificationError

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


def _main(prog: Any) -> Any:
    return prog.functions["main"]


def program_ops(prog: Any) -> list[str]:
    return [op.op_type for op in _main(prog).operations]


def op_counts(prog: Any) -> dict[str, int]:
    return dict(sorted(Counter(program_ops(prog)).items()))


def weight_bin_bytes(package: Path) -> int:
    """Bytes of the package's weight blob file(s)."""
    wdir = Path(package) / "Data" / "com.apple.CoreML" / "weights"
    return sum(p.stat().st_size for p in wdir.glob("*") if p.is_file()) if wdir.is_dir() else 0


def float_weights(prog: Any, min_size: int = 1) -> list[tuple[str, tuple[int, ...], str]]:
    """Float consts feeding a weight input of conv/linear/matmul: (name, shape, consumer op)."""
    out = []
    for op in _main(prog).operations:
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
    for op in _main(prog).operations:
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
    for op in _main(prog).operations:
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


# ------------------------------------------------------------------ interpreter


class MILInterpreter:
    """Runs the main function of a decompressed MIL program with torch (fp32, fp16 storage rounding)."""

    def __init__(self, prog: Any) -> None:
        import torch

        self.torch = torch
        self.fn = _main(prog)
        self.input_names = list(self.fn.inputs)
        self.output_names = [v.name for v in self.fn.outputs]
        missing = sorted({op.op_type for op in self.fn.operations if op.op_type not in _KERNELS and op.op_type != "const"})
        if missing:
            raise VerificationError(
                f"cannot check this Core ML program on {os.uname().sysname}: the host MIL interpreter has no kernel "
                f"for op(s) {', '.join(missing)}; run the bundle's run.py on macOS (Core ML predict) to verify it"
            )

    def peaks(self, feeds: dict[str, np.ndarray]) -> dict[str, float]:
        """Each op's largest finite |value| in or out, with fp32 arithmetic and storage (no fp16 rounding): which
        ops of an fp16 program would overflow fp16 or take a value it cannot hold."""
        out: dict[str, float] = {}
        self(feeds, fp32=True, peaks=out)
        return out

    def __call__(self, feeds: dict[str, np.ndarray], fp32: bool = False, peaks: dict[str, float] | None = None,
                 half: Any = None) -> list[np.ndarray]:
        """The program's outputs. ``fp32``: no fp16 rounding at all. ``half`` (a set of op names, on an fp32
        program): simulate the fp16 program coremltools' FP16ComputePrecision would make with only those ops in
        fp16 (their float inputs, weights included, and outputs rounded to fp16; the other ops stay fp32)."""
        with self.torch.no_grad():
            outs = self._run(feeds, fp32, peaks, half)
        return [o.detach().numpy().astype(np.float32) for o in outs]

    def _run(self, feeds: dict[str, np.ndarray], fp32: bool, peaks: dict[str, float] | None, half: Any
             ) -> list[Any]:
        torch = self.torch
        env: dict[str, Any] = {}
        for name in self.input_names:
            env[name] = torch.from_numpy(np.ascontiguousarray(feeds[name])).float()

        def val(var: Any) -> Any:
            if isinstance(var, (list, tuple)):
                return [val(v) for v in var]
            if var.name in env:
                return env[var.name]
            v = var.val
            if v is None:
                raise VerificationError(f"MIL interpreter: value of {var.name!r} is unknown (op order?)")
            if isinstance(v, np.ndarray) and v.dtype.kind in "fc":
                t = torch.from_numpy(np.ascontiguousarray(v)).float()
                env[var.name] = t
                return t
            if isinstance(v, np.ndarray) and v.dtype.kind in "iub" and v.ndim:
                return [int(x) for x in v.tolist()] if v.dtype.kind != "b" else v.tolist()
            if isinstance(v, np.generic):
                return v.item()
            return v

        def is_float(t: Any) -> bool:
            return isinstance(t, torch.Tensor) and t.dtype.is_floating_point

        for op in self.fn.operations:
            if op.op_type == "const":
                continue
            args = {k: val(v) for k, v in op.inputs.items()}
            if peaks is not None:  # an op that takes a value beyond fp16 must run in fp32 too (log of a power)
                for v in args.values():
                    if is_float(v) and v.numel():
                        peaks[op.name] = max(peaks.get(op.name, 0.0), _finite_peak(torch, v))
            if half is not None and op.name in half:
                args = {k: v.half().float() if is_float(v) else v for k, v in args.items()}
            outs = _KERNELS[op.op_type](torch, args)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for var, o in zip(op.outputs, outs, strict=True):
                if not is_float(o):
                    env[var.name] = o
                    continue
                if peaks is not None and o.numel():
                    peaks[op.name] = max(peaks.get(op.name, 0.0), _finite_peak(torch, o))
                if half is not None and op.name in half:
                    o = o.half().float()
                elif not fp32 and half is None and _is_fp16(var):
                    o = o.half().float()  # the program stores this tensor as fp16
                env[var.name] = o
        return [env[n] for n in self.output_names]


def _finite_peak(torch, t: Any) -> float:
    """Largest finite |value| of a tensor (0 where none is finite)."""
    return float(torch.nan_to_num(t.abs(), nan=0.0, posinf=0.0).max())


def _is_fp16(var: Any) -> bool:
    from coremltools.converters.mil.mil import types

    dt = getattr(var, "dtype", None)
    return dt is types.fp16


def _pad_input(torch, x, args, kernel, strides, dilations):
    import torch.nn.functional as F

    pad_type = args.get("pad_type", "valid")
    nd = len(kernel)
    if pad_type == "custom":
        pad = list(args.get("pad") or [0] * 2 * nd)  # [d0_begin, d0_end, d1_begin, d1_end]
    elif pad_type == "valid":
        pad = [0] * 2 * nd
    elif pad_type in ("same", "same_lower"):
        pad = []
        for i in range(nd):
            size = x.shape[2 + i]
            eff = (kernel[i] - 1) * dilations[i] + 1
            out = -(-size // strides[i])
            total = max((out - 1) * strides[i] + eff - size, 0)
            lo = total // 2 if pad_type == "same" else total - total // 2
            pad += [lo, total - lo]
    else:
        raise VerificationError(f"MIL interpreter: pad_type {pad_type!r} not handled")
    torch_pad = []
    for i in reversed(range(nd)):
        torch_pad += [pad[2 * i], pad[2 * i + 1]]
    return F.pad(x, torch_pad) if any(torch_pad) else x


def _conv(torch, a):
    import torch.nn.functional as F

    x, w = a["x"], a["weight"]
    nd = w.dim() - 2
    strides = a.get("strides") or [1] * nd
    dil = a.get("dilations") or [1] * nd
    x = _pad_input(torch, x, a, list(w.shape[2:]), strides, dil)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    return fn(x, w, a.get("bias"), stride=strides, dilation=dil, groups=int(a.get("groups") or 1))


def _pool(kind):
    def run(torch, a):
        import torch.nn.functional as F

        x, k = a["x"], list(a["kernel_sizes"])
        strides = a.get("strides") or k
        nd = len(k)
        pad_type = a.get("pad_type", "valid")
        ceil = bool(a.get("ceil_mode", False))
        if pad_type == "custom" and kind == "avg" and not a.get("exclude_padding_from_average", False):
            xp = _pad_input(torch, x, a, k, strides, [1] * nd)
            return getattr(F, f"avg_pool{nd}d")(xp, k, strides, ceil_mode=ceil)
        if pad_type == "valid" or not any(a.get("pad") or []):
            fn = getattr(F, f"{kind}_pool{nd}d")
            return fn(x, k, strides, ceil_mode=ceil)
        pad = list(a.get("pad") or [])
        sym = all(pad[2 * i] == pad[2 * i + 1] for i in range(nd))
        if pad_type != "custom" or not sym:
            raise VerificationError(f"MIL interpreter: {kind}_pool with pad_type {pad_type} / pad {pad} not handled")
        p = [pad[2 * i] for i in range(nd)]
        if kind == "max":
            return getattr(F, f"max_pool{nd}d")(x, k, strides, p, ceil_mode=ceil)
        return getattr(F, f"avg_pool{nd}d")(x, k, strides, p, ceil_mode=ceil, count_include_pad=False)

    return run


def _reduce(name):
    def run(torch, a):
        x = a["x"]
        axes = a.get("axes")
        keep = bool(a.get("keep_dims", False))
        dims = tuple(range(x.dim())) if axes is None else tuple(axes)
        if name == "mean":
            return x.mean(dim=dims, keepdim=keep)
        if name == "sum":
            return x.sum(dim=dims, keepdim=keep)
        out = x
        for d in sorted((d % x.dim() for d in dims), reverse=True):
            out = (out.amax if name == "max" else out.amin)(dim=d, keepdim=keep)
        return out

    return run


def _cast(torch, a):
    dt = a["dtype"]
    x = a["x"]
    if dt == "fp16":
        return x.float().half().float()
    if dt == "fp32":
        return x.float()
    if dt in ("int32", "int64", "int16", "int8", "uint8"):
        return x.to(torch.int64)
    if dt == "bool":
        return x.bool()
    raise VerificationError(f"MIL interpreter: cast to {dt} not handled")


def _matmul(torch, a):
    x, y = a["x"], a["y"]
    if a.get("transpose_x"):
        x = x.transpose(-1, -2)
    if a.get("transpose_y"):
        y = y.transpose(-1, -2)
    return torch.matmul(x, y)


def _batch_norm(torch, a):
    x = a["x"]
    shape = [1, -1] + [1] * (x.dim() - 2)
    mean, var = a["mean"].reshape(shape), a["variance"].reshape(shape)
    y = (x - mean) / torch.sqrt(var + float(a.get("epsilon", 1e-5)))
    if a.get("gamma") is not None:
        y = y * a["gamma"].reshape(shape)
    if a.get("beta") is not None:
        y = y + a["beta"].reshape(shape)
    return y


def _gelu(torch, a):
    mode = a.get("mode", "EXACT")
    return torch.nn.functional.gelu(a["x"], approximate="tanh" if mode == "TANH_APPROXIMATION" else "none")


def _qparams(torch, a, x):
    """quantize / dequantize's scale and zero point, shaped to broadcast along ``axis`` where per channel."""
    scale, zp = a["scale"], a.get("zero_point")
    scale = scale.float() if torch.is_tensor(scale) else torch.tensor(scale, dtype=torch.float32)
    if zp is None:
        zp = torch.zeros(())
    zp = zp.float() if torch.is_tensor(zp) else torch.tensor(zp, dtype=torch.float32)
    if scale.numel() > 1 or zp.numel() > 1:
        shape = [1] * x.dim()
        shape[int(a.get("axis") or 0) % x.dim()] = -1
        scale = scale.reshape(shape) if scale.numel() > 1 else scale.reshape(())
        zp = zp.reshape(shape) if zp.numel() > 1 else zp.reshape(())
    return scale, zp


def _quantize(torch, a):
    """iOS 17 ``quantize``: round(x / scale) + zero point, saturated to int8 / uint8 (held as integers here, so
    the interpreter's fp16 storage rounding never touches them)."""
    x = a["input"].float()
    scale, zp = _qparams(torch, a, x)
    lo, hi = (0, 255) if str(a.get("output_dtype")) == "uint8" else (-128, 127)
    return torch.clamp(torch.round(x / scale) + zp, lo, hi).to(torch.int32)


def _dequantize(torch, a):
    """iOS 17 ``dequantize``: (q - zero point) x scale."""
    x = a["input"]
    scale, zp = _qparams(torch, a, x)
    return (x.float() - zp) * scale


_KERNELS: dict[str, Any] = {
    "pixel_shuffle": lambda torch, a: torch.nn.functional.pixel_shuffle(a["x"], int(a["upscale_factor"])),
    "pixel_unshuffle": lambda torch, a: torch.nn.functional.pixel_unshuffle(a["x"], int(a["downscale_factor"])),
    "quantize": _quantize,
    "dequantize": _dequantize,
    "cast": _cast,
    "conv": _conv,
    "linear": lambda torch, a: torch.nn.functional.linear(a["x"], a["weight"], a.get("bias")),
    "matmul": _matmul,
    "relu": lambda torch, a: torch.relu(a["x"]),
    "relu6": lambda torch, a: torch.clamp(a["x"], 0, 6),
    "clip": lambda torch, a: torch.clamp(a["x"], float(a["alpha"]), float(a["beta"])),
    "sigmoid": lambda torch, a: torch.sigmoid(a["x"]),
    "tanh": lambda torch, a: torch.tanh(a["x"]),
    "silu": lambda torch, a: torch.nn.functional.silu(a["x"]),
    "gelu": _gelu,
    "leaky_relu": lambda torch, a: torch.nn.functional.leaky_relu(a["x"], float(a.get("alpha", 0.01))),
    # coremltools writes torch's hardswish as thresholded_relu(x, -3) -> sigmoid_hard -> mul (MIL: x if x >= alpha)
    "thresholded_relu": lambda torch, a: torch.where(a["x"] >= float(a.get("alpha", 1.0)), a["x"],
                                                     torch.zeros_like(a["x"])),
    "sigmoid_hard": lambda torch, a: torch.clamp(float(a.get("alpha", 0.2)) * a["x"] + float(a.get("beta", 0.5)), 0, 1),
    "softmax": lambda torch, a: torch.softmax(a["x"], dim=int(a.get("axis", -1))),
    "add": lambda torch, a: a["x"] + a["y"],
    "sub": lambda torch, a: a["x"] - a["y"],
    "mul": lambda torch, a: a["x"] * a["y"],
    "real_div": lambda torch, a: a["x"] / a["y"],
    "maximum": lambda torch, a: torch.maximum(torch.as_tensor(a["x"]), torch.as_tensor(a["y"])),
    "minimum": lambda torch, a: torch.minimum(torch.as_tensor(a["x"]), torch.as_tensor(a["y"])),
    "reduce_mean": _reduce("mean"),
    "reduce_sum": _reduce("sum"),
    "reduce_max": _reduce("max"),
    "reduce_min": _reduce("min"),
    "avg_pool": _pool("avg"),
    "max_pool": _pool("max"),
    "batch_norm": _batch_norm,
    "reshape": lambda torch, a: a["x"].reshape(list(a["shape"])),
    "transpose": lambda torch, a: a["x"].permute(list(a["perm"])),
    "squeeze": lambda torch, a: a["x"].squeeze() if a.get("axes") is None else _squeeze(a["x"], a["axes"]),
    "expand_dims": lambda torch, a: _expand(a["x"], a["axes"]),
    "concat": lambda torch, a: torch.cat(list(a["values"]), dim=int(a["axis"])),
    "identity": lambda torch, a: a["x"],
    # the ops the zoo's published models need (PP-OCR's FPN, openWakeWord, Silero VAD, Resemblyzer)
    "conv_transpose": lambda torch, a: _conv_transpose(torch, a),
    "upsample_nearest_neighbor": lambda torch, a: torch.nn.functional.interpolate(
        a["x"], scale_factor=(float(a.get("scale_factor_height", 1)), float(a.get("scale_factor_width", 1))),
        mode="nearest"),
    "upsample_bilinear": lambda torch, a: torch.nn.functional.interpolate(
        a["x"], scale_factor=(float(a.get("scale_factor_height", 1)), float(a.get("scale_factor_width", 1))),
        mode="bilinear", align_corners=bool(a.get("align_corners", False))),
    "pad": lambda torch, a: _mil_pad(torch, a),
    "slice_by_index": lambda torch, a: _slice_by_index(torch, a),
    "slice_by_size": lambda torch, a: a["x"][tuple(slice(b, None if z == -1 else b + z)
                                                   for b, z in zip(a["begin"], a["size"], strict=True))],
    "split": lambda torch, a: _split(torch, a),
    "stack": lambda torch, a: torch.stack(list(a["values"]), dim=int(a["axis"])),
    "tile": lambda torch, a: a["x"].repeat(list(a["reps"])),
    "pow": lambda torch, a: torch.pow(torch.as_tensor(a["x"]), torch.as_tensor(a["y"])),
    "sqrt": lambda torch, a: torch.sqrt(a["x"]),
    "rsqrt": lambda torch, a: torch.rsqrt(a["x"] + float(a.get("epsilon", 1e-12))),
    "exp": lambda torch, a: torch.exp(a["x"]),
    "log": lambda torch, a: torch.log(a["x"] + float(a.get("epsilon", 1e-45))),
    "abs": lambda torch, a: torch.abs(a["x"]),
    "square": lambda torch, a: a["x"] * a["x"],
    "inverse": lambda torch, a: 1.0 / (a["x"] + float(a.get("epsilon", 1e-4))),
    "erf": lambda torch, a: torch.erf(a["x"]),
    "elu": lambda torch, a: torch.nn.functional.elu(a["x"], float(a.get("alpha", 1.0))),
    "softplus": lambda torch, a: torch.nn.functional.softplus(a["x"]),
    "prelu": lambda torch, a: torch.where(a["x"] >= 0, a["x"],
                                          a["x"] * a["alpha"].reshape([1, -1] + [1] * (a["x"].dim() - 2))),
    "select": lambda torch, a: torch.where(torch.as_tensor(a["cond"]).bool(), torch.as_tensor(a["a"]),
                                           torch.as_tensor(a["b"])),
    "greater": lambda torch, a: torch.as_tensor(a["x"]) > torch.as_tensor(a["y"]),
    "greater_equal": lambda torch, a: torch.as_tensor(a["x"]) >= torch.as_tensor(a["y"]),
    "less": lambda torch, a: torch.as_tensor(a["x"]) < torch.as_tensor(a["y"]),
    "less_equal": lambda torch, a: torch.as_tensor(a["x"]) <= torch.as_tensor(a["y"]),
    "equal": lambda torch, a: torch.as_tensor(a["x"]) == torch.as_tensor(a["y"]),
    "logical_not": lambda torch, a: ~torch.as_tensor(a["x"]).bool(),
    "layer_norm": lambda torch, a: _layer_norm(torch, a),
    "reduce_l2_norm": lambda torch, a: torch.sqrt(torch.sum(a["x"] * a["x"], dim=_axes(a, a["x"]),
                                                            keepdim=bool(a.get("keep_dims", False)))),
    "lstm": lambda torch, a: _lstm(torch, a),
    "gather": lambda torch, a: _gather(torch, a),
    "gather_along_axis": lambda torch, a: torch.gather(a["x"], int(a.get("axis", 0)),
                                                       torch.as_tensor(a["indices"]).long() % a["x"].shape[
                                                           int(a.get("axis", 0))]),
}


def _gather(torch, a):
    x, axis = a["x"], int(a.get("axis", 0)) % a["x"].dim()
    if int(a.get("batch_dims", 0) or 0):
        raise VerificationError("MIL interpreter: gather with batch_dims is not handled")
    idx = torch.as_tensor(a["indices"]).long()
    flat = idx.reshape(-1) % x.shape[axis]
    y = torch.index_select(x, axis, flat)
    return y.reshape(list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:]))


def _axes(a, x):
    axes = a.get("axes")
    return list(range(x.dim())) if axes is None else [int(d) for d in axes]


def _conv_transpose(torch, a):
    import torch.nn.functional as F

    x, w = a["x"], a["weight"]  # weight: [C_in, C_out / groups, *kernel]
    nd = w.dim() - 2
    strides = list(a.get("strides") or [1] * nd)
    dil = list(a.get("dilations") or [1] * nd)
    pad = list(a.get("pad") or [0] * 2 * nd) if a.get("pad_type", "valid") == "custom" else [0] * 2 * nd
    y = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd](
        x, w, a.get("bias"), stride=strides, dilation=dil, groups=int(a.get("groups") or 1))
    idx = [slice(None), slice(None)] + [slice(pad[2 * i], y.shape[2 + i] - pad[2 * i + 1]) for i in range(nd)]
    y = y[tuple(idx)]
    shape = a.get("output_shape")
    if shape is not None and list(y.shape[2:]) != list(shape)[-nd:]:
        raise VerificationError(f"MIL interpreter: conv_transpose output {list(y.shape)} != {list(shape)}")
    return y


def _mil_pad(torch, a):
    import torch.nn.functional as F

    x, pad = a["x"], [int(p) for p in a["pad"]]  # [d0_begin, d0_end, ...] over the last len(pad) / 2 dims
    k = len(pad) // 2
    tp = []
    for i in reversed(range(k)):
        tp += [pad[2 * i], pad[2 * i + 1]]
    mode = {"constant": "constant", "reflect": "reflect", "replicate": "replicate"}[a.get("mode", "constant")]
    if mode == "constant":
        return F.pad(x, tp, value=float(a.get("constant_val", 0.0)))
    while len(tp) > 2 and tp[-2:] == [0, 0]:
        tp = tp[:-2]
    squeeze = 0
    while x.dim() < len(tp) // 2 + 2:  # torch pads 1-3 spatial dims of a batched tensor
        x, squeeze = x.unsqueeze(0), squeeze + 1
    tp += [0, 0] * (x.dim() - 2 - len(tp) // 2)  # and wants a pair for each of them
    y = F.pad(x, tp, mode=mode)
    for _ in range(squeeze):
        y = y.squeeze(0)
    return y


def _slice_by_index(torch, a):
    x = a["x"]
    n = x.dim()
    begin, end = list(a["begin"]), list(a["end"])
    stride = list(a.get("stride") or [1] * n)
    bm = list(a.get("begin_mask") or [False] * n)
    em = list(a.get("end_mask") or [False] * n)
    sm = list(a.get("squeeze_mask") or [False] * n)
    idx = []
    for d in range(n):
        st = int(stride[d])
        b = None if bm[d] else int(begin[d])
        e = None if em[d] else int(end[d])
        if sm[d]:
            idx.append(int(begin[d]))
            continue
        if st < 0:
            rows = list(range(x.shape[d]))[slice(b, e, st)]
            idx.append(torch.tensor(rows, dtype=torch.long))
            continue
        idx.append(slice(b, e, st))
    out = x
    for d in reversed(range(n)):  # one dim at a time: tensor indices on several dims would broadcast
        full = [slice(None)] * d + [idx[d]]
        out = out[tuple(full)]
    return out


def _split(torch, a):
    x, axis = a["x"], int(a["axis"])
    sizes = a.get("split_sizes")
    if sizes is None:
        sizes = [x.shape[axis] // int(a["num_splits"])] * int(a["num_splits"])
    return tuple(torch.split(x, [int(s) for s in sizes], dim=axis))


def _layer_norm(torch, a):
    x = a["x"]
    axes = _axes(a, x)
    mean = x.mean(dim=axes, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=axes, keepdim=True)
    y = (x - mean) / torch.sqrt(var + float(a.get("epsilon", 1e-5)))
    if a.get("gamma") is not None:
        y = y * a["gamma"]
    if a.get("beta") is not None:
        y = y + a["beta"]
    return y


def _lstm(torch, a):
    """MIL lstm (iOS15 recurrent.lstm): x [T, B, I]; weights [4H, I] / [4H, H], gates ordered i, f, o, z;
    bias [4H] (input + recurrent); initial_h / initial_c [B, D*H]; outputs (y, h, c)."""
    if a.get("peephole") is not None or a.get("clip") is not None:
        raise VerificationError("MIL interpreter: lstm with peepholes or clip is not handled")
    acts = (a.get("recurrent_activation", "sigmoid"), a.get("cell_activation", "tanh"), a.get("activation", "tanh"))
    if acts != ("sigmoid", "tanh", "tanh"):
        raise VerificationError(f"MIL interpreter: lstm activations {acts} are not handled")
    x = a["x"]
    T, B = x.shape[0], x.shape[1]
    H = a["weight_hh"].shape[1]
    direction = a.get("direction", "forward")
    dirs = [("f", a["weight_ih"], a["weight_hh"], a.get("bias"))]
    if direction == "bidirectional":
        dirs.append(("b", a["weight_ih_back"], a["weight_hh_back"], a.get("bias_back")))
    elif direction == "reverse":
        dirs = [("b", a["weight_ih"], a["weight_hh"], a.get("bias"))]
    h0 = a["initial_h"].reshape(B, -1)
    c0 = a["initial_c"].reshape(B, -1)
    ys, hs, cs = [], [], []
    for k, (way, wi, wh, b) in enumerate(dirs):
        h, c = h0[:, k * H:(k + 1) * H], c0[:, k * H:(k + 1) * H]
        steps = range(T) if way == "f" else range(T - 1, -1, -1)
        seq = [None] * T
        for t in steps:
            g = x[t] @ wi.T + h @ wh.T + (0 if b is None else b)
            i, f, o, z = g.split(H, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(z)
            h = torch.sigmoid(o) * torch.tanh(c)
            seq[t] = h
        ys.append(torch.stack(seq) if a.get("output_sequence", False) else h.unsqueeze(0))
        hs.append(h)
        cs.append(c)
    return torch.cat(ys, dim=-1), torch.cat(hs, dim=-1), torch.cat(cs, dim=-1)


def _squeeze(x, axes):
    for d in sorted((d % x.dim() for d in axes), reverse=True):
        x = x.squeeze(d)
    return x


def _expand(x, axes):
    rank = x.dim() + len(axes)
    for d in sorted(d % rank for d in axes):
        x = x.unsqueeze(d)
    return x

