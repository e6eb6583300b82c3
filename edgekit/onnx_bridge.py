"""The ONNX -> torch bridge, for the targets whose converters read torch (android via litert-torch, ios via
coremltools, fpga via hls4ml's torch front end): onnx2torch rebuilds the prepared graph (edgekit.onnx_prepare)
as a torch.fx module, edgekit adds the ONNX ops it lacks (edgekit.onnx2torch_ops), checks the module against
onnxruntime on real inputs, and exports it with ``torch.export``. Why this bridge (and not onnx2tf or onnx-tf)
is measured in docs/zoo.md: it keeps one float reference (onnxruntime on the prepared graph), needs no second
TensorFlow, and reuses every torch path edgekit already verifies.

onnx2torch 1.5.15 is vendored in ``third_party/`` (imported as ``edgekit._vendor``; why, and what changed: its
README.md): every release requires torchvision, whose PyPI wheel is a CUDA build that fails to import beside
CPU torch.
"""

from __future__ import annotations

import numpy as np

from edgekit.deps import require
from edgekit.errors import ModelLoadError, UnsupportedOpError

ONNX2TORCH = "1.5.15"  # the vendored release (third_party/onnx2torch)


def differs(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why a bridged model's output is not its source's on the same inputs (None: within 1e-4 of the output's
    scale): the check both bridges (onnx2torch here, tf2onnx in edgekit.tf_bridge) make before anything converts."""
    if got.shape != want.shape:
        return f"shape {got.shape}, not {want.shape}"
    diff = float(np.max(np.abs(np.asarray(got, np.float64) - want), initial=0.0))
    scale = float(np.max(np.abs(want), initial=0.0))
    return None if diff <= 1e-4 * max(1.0, scale) else f"max difference {diff:.4g}"


def bridge_model(model, source: str):
    """An ONNX :class:`~edgekit.ingest.Model` as a torch ExportedProgram Model (the onnx2torch bridge), for a
    converter that reads torch. The float reference stays onnxruntime on the prepared graph; the bridged
    module is checked against it on seeded inputs first, so a wrong translation is refused here."""
    import dataclasses

    torch = require("torch")
    onnx = require("onnx")
    prep = model.onnx_prep
    if prep is not None and prep.quantized_ops:
        qdq_only = set(prep.quantized_ops) <= {"QuantizeLinear", "DequantizeLinear"}
        raise UnsupportedOpError(
            f"{source}: the model is already quantized ({', '.join(prep.quantized_ops)}); this target's converter "
            "quantizes a float model itself: give the float ONNX model"
            + (" (or convert this one for --target jetson: TensorRT runs Q/DQ graphs)" if qdq_only else ""))
    proto = prep.proto if prep is not None else onnx.load(str(model.onnx_path))
    module = to_torch(proto, source).eval()
    feeds = model.seeded_feeds(1)
    example = tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs)
    from edgekit.quiet import quiet_loggers

    try:
        with torch.no_grad(), quiet_loggers("torch", "torch._export", "torch.export", "torch.fx"):
            got = module(*example)
            got = list(got) if isinstance(got, (list, tuple)) else [got]
            want = model.reference()(feeds)
            for o, a, b in zip(model.outputs, got, want, strict=True):
                why = differs(a.detach().numpy(), b)
                if why:
                    raise UnsupportedOpError(
                        f"{source}: the ONNX -> torch bridge (onnx2torch {ONNX2TORCH}) computes output "
                        f"{o.name!r} differently from onnxruntime ({why}); a limitation of the bridge: convert for "
                        "--target jetson")
            ep = torch.export.export(module, example)
    except UnsupportedOpError:
        raise
    except Exception as exc:  # torch.export raises many types on graphs it cannot trace
        raise UnsupportedOpError(
            f"{source}: torch.export cannot trace the bridged model ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200]}); a limitation of the ONNX -> torch bridge: convert for "
            "--target jetson") from None
    return dataclasses.replace(model, kind="exported_program", torch_module=ep.module(), exported=ep,
                               bridge=f"onnx2torch {ONNX2TORCH}")


def to_torch(proto, source: str):
    """The prepared ONNX graph as a torch.fx module (onnx2torch plus edgekit's extra converters).
    Raises UnsupportedOpError naming the op onnx2torch cannot translate."""
    require("torch")
    from edgekit._vendor import onnx2torch
    from edgekit.onnx2torch_ops import register_extra_converters
    from edgekit.onnx_rewrites import explicit_auto_pads

    register_extra_converters()
    if any(a.name == "auto_pad" for n in proto.graph.node for a in n.attribute):
        import copy

        proto = copy.deepcopy(proto)  # the prepared graph stays as given (it is the float reference)
        explicit_auto_pads(proto)
    try:
        return onnx2torch.convert(proto)
    except UnsupportedOpError:
        raise
    except NotImplementedError as exc:
        msg = str(exc)
        import re

        m = re.search(r"operation_type='(\w+)', version=(\d+)", msg)
        what = (f"ONNX op {m.group(1)} (opset {m.group(2)}) has no torch translation" if m else
                f"a node cannot be translated ({msg.splitlines()[0][:160]})")
        raise UnsupportedOpError(
            f"{source}: {what} in onnx2torch {ONNX2TORCH}, the bridge edgekit uses for this target (a "
            "limitation of the bridge, not of the target); convert for --target jetson, or replace that op in the "
            "model") from None
    except Exception as exc:  # onnx2torch raises KeyError / AttributeError on graphs it cannot read
        raise ModelLoadError(
            f"{source}: the ONNX -> torch bridge (onnx2torch {ONNX2TORCH}) failed "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
            "a limitation of the bridge: convert for --target jetson") from None
