"""The host MIL interpreter: Core ML's ``predict`` exists only on macOS, so on Linux the *decompressed* MIL
program of a package runs here with torch kernels, fp32 arithmetic, rounding each tensor the program stores as
fp16 to fp16. It checks the converted graph and the compressed weights read back from the package; it does not
reproduce Core ML's own fp16 arithmetic (accumulation order, ANE fixed-point details), so its numbers measure the
weight compression, not the device.

The kernels cover the ops coremltools writes for CNN classifiers (conv, pooling, normalisation, activations,
elementwise, reductions, reshapes, linear/matmul) and the zoo's published models. Any other op is a
:class:`VerificationError` naming the op, so a model outside that set is reported as "verify on macOS", never
silently skipped.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from edgekit.converters.coreml.kernels import (
    axes_of,
    batch_norm,
    cast,
    conv,
    conv_transpose,
    dequantize,
    expand_axes,
    gather,
    gelu,
    layer_norm,
    lstm,
    matmul,
    mil_pad,
    pool,
    quantize,
    reduce_op,
    slice_by_index,
    split,
    squeeze_axes,
)
from edgekit.converters.coreml.mil import main_function
from edgekit.errors import VerificationError


class MILInterpreter:
    """Runs the main function of a decompressed MIL program with torch (fp32, fp16 storage rounding)."""

    def __init__(self, prog: Any) -> None:
        import torch

        self.torch = torch
        self.fn = main_function(prog)
        self.input_names = list(self.fn.inputs)
        self.output_names = [v.name for v in self.fn.outputs]
        missing = sorted({op.op_type for op in self.fn.operations
                          if op.op_type not in _KERNELS and op.op_type != "const"})
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
            outs = self.run_tensors(feeds, fp32, peaks, half)
        return [o.detach().numpy().astype(np.float32) for o in outs]

    def run_tensors(self, feeds: dict[str, np.ndarray], fp32: bool, peaks: dict[str, float] | None, half: Any
                    ) -> list[Any]:
        """The program's outputs as torch tensors (the arguments are ``__call__``'s)."""
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

_KERNELS: dict[str, Any] = {
    "pixel_shuffle": lambda torch, a: torch.nn.functional.pixel_shuffle(a["x"], int(a["upscale_factor"])),
    "pixel_unshuffle": lambda torch, a: torch.nn.functional.pixel_unshuffle(a["x"], int(a["downscale_factor"])),
    "quantize": quantize,
    "dequantize": dequantize,
    "cast": cast,
    "conv": conv,
    "linear": lambda torch, a: torch.nn.functional.linear(a["x"], a["weight"], a.get("bias")),
    "matmul": matmul,
    "relu": lambda torch, a: torch.relu(a["x"]),
    "relu6": lambda torch, a: torch.clamp(a["x"], 0, 6),
    "clip": lambda torch, a: torch.clamp(a["x"], float(a["alpha"]), float(a["beta"])),
    "sigmoid": lambda torch, a: torch.sigmoid(a["x"]),
    "tanh": lambda torch, a: torch.tanh(a["x"]),
    "silu": lambda torch, a: torch.nn.functional.silu(a["x"]),
    "gelu": gelu,
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
    "reduce_mean": reduce_op("mean"),
    "reduce_sum": reduce_op("sum"),
    "reduce_max": reduce_op("max"),
    "reduce_min": reduce_op("min"),
    "avg_pool": pool("avg"),
    "max_pool": pool("max"),
    "batch_norm": batch_norm,
    "reshape": lambda torch, a: a["x"].reshape(list(a["shape"])),
    "transpose": lambda torch, a: a["x"].permute(list(a["perm"])),
    "squeeze": lambda torch, a: a["x"].squeeze() if a.get("axes") is None else squeeze_axes(a["x"], a["axes"]),
    "expand_dims": lambda torch, a: expand_axes(a["x"], a["axes"]),
    "concat": lambda torch, a: torch.cat(list(a["values"]), dim=int(a["axis"])),
    "identity": lambda torch, a: a["x"],
    # the ops of published detectors, recognisers and audio models (FPNs, spectrogram front ends, LSTMs)
    "conv_transpose": lambda torch, a: conv_transpose(torch, a),
    "upsample_nearest_neighbor": lambda torch, a: torch.nn.functional.interpolate(
        a["x"], scale_factor=(float(a.get("scale_factor_height", 1)), float(a.get("scale_factor_width", 1))),
        mode="nearest"),
    "upsample_bilinear": lambda torch, a: torch.nn.functional.interpolate(
        a["x"], scale_factor=(float(a.get("scale_factor_height", 1)), float(a.get("scale_factor_width", 1))),
        mode="bilinear", align_corners=bool(a.get("align_corners", False))),
    "pad": lambda torch, a: mil_pad(torch, a),
    "slice_by_index": lambda torch, a: slice_by_index(torch, a),
    "slice_by_size": lambda torch, a: a["x"][tuple(slice(b, None if z == -1 else b + z)
                                                   for b, z in zip(a["begin"], a["size"], strict=True))],
    "split": lambda torch, a: split(torch, a),
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
    "layer_norm": lambda torch, a: layer_norm(torch, a),
    "reduce_l2_norm": lambda torch, a: torch.sqrt(torch.sum(a["x"] * a["x"], dim=axes_of(a, a["x"]),
                                                            keepdim=bool(a.get("keep_dims", False)))),
    "lstm": lambda torch, a: lstm(torch, a),
    "gather": lambda torch, a: gather(torch, a),
    "gather_along_axis": lambda torch, a: torch.gather(a["x"], int(a.get("axis", 0)),
                                                       torch.as_tensor(a["indices"]).long() % a["x"].shape[
                                                           int(a.get("axis", 0))]),
}
