"""The float ONNX graph every ONNX-based target starts from: export, fix shapes, clean up."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit.deps import require
from edgekit.errors import ConversionError
from edgekit.ingest import Model
from edgekit.quiet import first_line

DEFAULT_OPSET = 18  # torch.onnx's torch.export path writes >= 18; TensorRT 8.6+ parses it
MAX_IR_VERSION = 10  # onnxruntime 1.2x-1.3x reject IR 14 (onnx 1.23's default for new models)


def export_onnx(model: Model, dest: Path, opset: int = DEFAULT_OPSET) -> Path:
    """Write the float model as ONNX at ``dest`` with static input shapes."""
    onnx = require("onnx")
    dest = Path(dest)
    if not model.is_torch:
        proto = onnx.load(str(model.onnx_path))
        fix_input_shapes(proto, model)
        onnx.save(proto, str(dest))
        return dest
    torch = require("torch")
    require("onnxscript")
    quiet_torch_logs()
    feeds = model.example_feeds()
    args = tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs)
    in_names = [s.name for s in model.inputs]
    out_names = [s.name for s in model.outputs]
    log = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(log):
            warnings.simplefilter("ignore")
            if model.kind == "torchscript":
                torch.onnx.export(
                    model.torch_module, args, str(dest), dynamo=False, opset_version=opset,
                    input_names=in_names, output_names=out_names,
                )
            else:
                what = model.exported if model.exported is not None else model.torch_module
                prog = torch.onnx.export(
                    what, args, dynamo=True, opset_version=opset, input_names=in_names,
                    output_names=out_names, verbose=False,
                )
                prog.save(str(dest))
    except Exception as exc:
        raise ConversionError(
            f"torch.onnx.export failed for {model.source}: {type(exc).__name__}: {first_line(exc)}; "
            "if the model has data-dependent control flow, export it with fixed shapes or give an ONNX file"
        ) from None
    proto = onnx.load(str(dest))
    if proto.ir_version > MAX_IR_VERSION:
        onnx.save(cap_ir_version(proto), str(dest))
    return dest


def cap_ir_version(proto: Any) -> Any:
    """Write at most IR version MAX_IR_VERSION (onnxruntime rejects newer ones onnx may default to)."""
    if proto.ir_version > MAX_IR_VERSION:
        proto.ir_version = MAX_IR_VERSION
    return proto


def quiet_torch_logs() -> None:
    """torch.onnx logs a warning per missing torchvision op; edgekit never needs them."""
    import logging

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)


def toposort(proto: Any) -> Any:
    """Sort graph nodes topologically (some rewriters append nodes out of order)."""
    g = proto.graph
    ready = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    nodes = list(g.node)
    ordered = []
    while nodes:
        rest = []
        for n in nodes:
            if all(i in ready for i in n.input):
                ordered.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(nodes):
            raise ConversionError(f"ONNX graph has a cycle or a missing input at node {rest[0].name!r}")
        nodes = rest
    del g.node[:]
    g.node.extend(ordered)
    return proto




def fix_input_shapes(proto: Any, model: Model) -> None:
    """Write the model's (static) input shapes into the graph's inputs."""
    by_name = {s.name: s for s in model.inputs}
    for vi in proto.graph.input:
        spec = by_name.get(vi.name)
        if spec is None:
            continue
        dims = vi.type.tensor_type.shape.dim
        for d, n in zip(dims, spec.shape, strict=False):
            d.Clear()
            d.dim_value = n


def slim(src: Path, dest: Path) -> dict[str, int]:
    """onnxslim: constant folding, dead-node removal, fusions that stay portable."""
    onnx = require("onnx")
    onnxslim = require("onnxslim")
    proto = onnx.load(str(src))
    before = len(proto.graph.node)
    with contextlib.redirect_stdout(io.StringIO()):
        out = onnxslim.slim(proto)
    out = prune_opsets(out)
    cap_ir_version(out)
    onnx.save(out, str(dest))
    return {"nodes_before": before, "nodes_after": len(out.graph.node)}


def prune_opsets(proto: Any) -> Any:
    """Drop opset imports of domains no node uses (quantization tools add many)."""
    used = {n.domain or "" for n in proto.graph.node}
    keep = [o for o in proto.opset_import if (o.domain or "") in used or o.domain in ("", "ai.onnx")]
    del proto.opset_import[:]
    proto.opset_import.extend(keep)
    return proto


def tensor_values(model: Any, names: list[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A runner of ``model`` (an ONNX path or proto, left as it is) that returns the values of the tensors
    ``names`` (any in the graph, inputs included) for one feed: one onnxruntime session of a copy whose graph
    outputs are those tensors."""
    onnx = require("onnx", "jetson")
    ort = require("onnxruntime", "jetson")
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model if isinstance(model, onnx.ModelProto) else onnx.load(str(model)))
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in names)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda feed: dict(zip(names, sess.run(names, feed), strict=True))
