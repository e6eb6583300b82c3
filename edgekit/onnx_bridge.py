"""The ONNX -> torch bridge, for the targets whose converters read torch (android via litert-torch, ios via
coremltools, fpga via hls4ml's torch front end): onnx2torch rebuilds the prepared graph (edgekit.onnx_prepare)
as a torch.fx module, edgekit adds the ONNX ops it lacks (edgekit.onnx2torch_ops), checks the module against
onnxruntime on real inputs, and exports it with ``torch.export``. Why this bridge (and not onnx2tf or onnx-tf)
is measured in docs/zoo.md: it keeps one float reference (onnxruntime on the prepared graph), needs no second
TensorFlow, and reuses every torch path edgekit already verifies.

onnx2torch imports torchvision for its NMS and RoiAlign converters only; the torchvision wheel on PyPI is
a CUDA build that fails to import beside CPU torch, so edgekit installs onnx2torch without dependencies
and, where torchvision is absent, gives onnx2torch a stand-in whose ops refuse with a one-line reason.
"""

from __future__ import annotations

import sys
import types

import numpy as np

from edgekit.deps import require
from edgekit.errors import ModelLoadError, UnsupportedOpError


def stub_torchvision() -> bool:
    """onnx2torch imports torchvision (for NMS / RoiAlign only). Where it is absent, a stand-in whose ops refuse
    (True: the stand-in was put in place)."""
    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # absent, or the PyPI CUDA build failing beside CPU torch
        for k in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[k]

    def refuse(*_a, **_k):
        raise UnsupportedOpError("the model uses NonMaxSuppression / RoiAlign, which edgekit's ONNX -> torch bridge "
                                 "runs with torchvision (not installed); convert it for --target jetson, or cut the "
                                 "post-processing off the graph")

    tv = types.ModuleType("torchvision")
    tv.ops = types.ModuleType("torchvision.ops")  # type: ignore[attr-defined]
    tv.ops.nms = tv.ops.roi_align = tv.ops.box_convert = refuse  # type: ignore[attr-defined]
    tv.__edgekit_stand_in__ = True  # type: ignore[attr-defined]
    sys.modules["torchvision"] = tv
    sys.modules["torchvision.ops"] = tv.ops  # type: ignore[attr-defined]
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
                        f"{source}: the ONNX -> torch bridge (onnx2torch {onnx2torch_version()}) computes output "
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
                               bridge=f"onnx2torch {onnx2torch_version()}")


def onnx2torch_version() -> str | None:
    from edgekit.deps import version

    return version("onnx2torch")


def to_torch(proto, source: str):
    """The prepared ONNX graph as a torch.fx module (onnx2torch plus edgekit's extra converters).
    Raises UnsupportedOpError naming the op onnx2torch cannot translate."""
    require("torch")
    stubbed = "onnx2torch" not in sys.modules and stub_torchvision()
    try:
        import onnx2torch
    except ImportError:
        from edgekit.errors import MissingToolchainError

        raise MissingToolchainError(
            "onnx2torch is needed to take an ONNX model to this target but is not installed; "
            "pip install --no-deps onnx2torch==1.5.15 (its torchvision requirement would pull a CUDA build)"
        ) from None
    finally:
        if stubbed:  # the stand-in only while onnx2torch imports: torch.onnx looks torchvision up by spec
            for k in ("torchvision", "torchvision.ops"):
                sys.modules.pop(k, None)
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
            f"{source}: {what} in onnx2torch {onnx2torch_version()}, the bridge edgekit uses for this target (a "
            "limitation of the bridge, not of the target); convert for --target jetson, or replace that op in the "
            "model") from None
    except Exception as exc:  # onnx2torch raises KeyError / AttributeError on graphs it cannot read
        raise ModelLoadError(
            f"{source}: the ONNX -> torch bridge (onnx2torch {onnx2torch_version()}) failed "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
            "a limitation of the bridge: convert for --target jetson") from None
