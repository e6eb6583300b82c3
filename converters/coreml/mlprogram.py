"""A torch model as a Core ML ML program: ``coremltools.convert`` from its torch.export program (TorchScript
only where torch.export refuses the model, or coremltools' torch.export frontend lacks an op), the names and types
of its Core ML inputs and outputs, and what a failed conversion means for the user."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.deps import require
from edgekit.errors import ConversionError, UnsupportedOpError

EXTRA = "ios"


def load_coremltools() -> Any:
    """coremltools (the ios extra), with the converters edgekit adds to its torch.export frontend."""
    ct = require("coremltools", EXTRA)
    _lstm_for_torch_export()
    _prelu_any_rank()
    return ct


def _prelu_any_rank() -> None:
    """coremltools' ``prelu`` converter hands MIL's ``prelu`` a rank-3 tensor for a rank-1/2 input (a PReLU after
    a Linear layer) and a rank-5 one as it comes, and MIL's prelu takes one alpha per channel only at rank 4
    ("rank 3 or rank 5 input is only supported when all the values of alpha are same"). Registered over it: rank 4,
    or one alpha for every channel, as before; otherwise PReLU written out as ``relu(x) + alpha * min(x, 0)``, alpha
    along axis 1 (what android's int8 rewrite does too)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    original = _TORCH_OPS_REGISTRY.get_func("prelu")
    if original is None or getattr(original, "edgekit", False):
        return

    def prelu(context, node):
        x, alpha = ops._get_inputs(context, node, expected=2)
        a = np.asarray(alpha.val, dtype=np.float32).reshape(-1) if alpha.val is not None else None
        if a is None or x.rank == 4 or a.size == 1:
            return original(context, node)
        shape = [1] * x.rank
        shape[1 if x.rank >= 2 else 0] = a.size
        negative = mb.mul(x=mb.minimum(x=x, y=np.float32(0.0)), y=a.reshape(shape))
        context.add(mb.add(x=mb.relu(x=x), y=negative, name=node.name))

    prelu.edgekit = True  # type: ignore[attr-defined]
    _TORCH_OPS_REGISTRY.set_func_by_name(prelu, "prelu")


def _lstm_for_torch_export() -> None:
    """coremltools' torch.export frontend looks an op up by its overload's name: aten.lstm.input as
    ``lstm.input``, which coremltools 9 leaves unregistered, so every LSTM model failed there ("cannot convert
    op aten.lstm.input"). Its ``lstm`` converter, written for TorchScript's aten::lstm, reads the same schema
    (input, hx[], params[], has_biases, num_layers, dropout, train, bidirectional, batch_first) but names one
    output per result, where a torch.export node has one output, the tuple its ``getitem`` users index (the
    final state: ``_, (h, c) = lstm(x)``). Registered under that name, with its three results bound as that
    tuple, torch.export programs with LSTMs convert (exact to 1.5e-8 on a 2-layer LSTM), and so do their PT2E
    W8A8 versions, which the TorchScript frontend cannot read."""
    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    if _TORCH_OPS_REGISTRY.get_func("lstm.input") is not None:
        return

    def lstm_input(context, node):
        names, saved = [f"{node.name}__result{i}" for i in range(3)], node.outputs
        node.outputs = names
        try:
            ops.lstm(context, node)
        finally:
            node.outputs = saved
        context.add(tuple(context[n] for n in names), node.name)

    _TORCH_OPS_REGISTRY.set_func_by_name(lstm_input, "lstm.input")


def convert_torch(job: ConvertJob, ct: Any, ios: int, force_fp32: bool = False,
                  quantized: dict[str, Any] | None = None, precision: Any = None) -> tuple[Any, str]:
    """The ML program of ``job``'s torch model for iOS ``ios`` and the route that made it. ``quantized``: the PT2E
    W8A8 module (:func:`edgekit.converters.coreml.w8a8.pt2e_w8a8`); ``precision``: a compute precision other
    than the job's (fp32 where ``force_fp32``)."""
    torch = require("torch")
    m = job.model
    if not m.is_torch:
        raise ConversionError(
            f"{m.source}: Core ML converts torch models (coremltools dropped its ONNX frontend); "
            "give the .pt2 / TorchScript / pkg.module:factory the ONNX came from"
        )
    names = coreml_names([s.name for s in m.inputs + m.outputs])
    inputs = [ct.TensorType(name=names[s.name], shape=s.shape, dtype=np.dtype(coreml_dtype(s.dtype)).type)
              for s in m.inputs]
    outputs = [ct.TensorType(name=names[s.name], dtype=np.float32) for s in m.outputs]
    target = getattr(ct.target, f"iOS{ios}")
    if precision is None:
        precision = ct.precision.FLOAT32 if job.precision == "fp32" or force_fp32 else ct.precision.FLOAT16
    route = "torch.export"
    ep = None
    if quantized is not None:  # the PT2E-quantized module (W8A8 on Linux): its own export, no fallback
        try:
            source = torch.export.export(quantized["module"], quantized["sample"]).run_decompositions({})
        except Exception as exc:  # noqa: BLE001 - torch.export raises many types
            raise ConversionError(f"{m.source}: the W8A8 (PT2E) program does not export again for Core ML "
                                  f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
        try:
            return ct.convert(source, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                              minimum_deployment_target=target, compute_precision=precision), \
                "torch.export + PT2E W8A8"
        except Exception as exc:  # coremltools raises NotImplementedError/ValueError/RuntimeError/AssertionError
            first = _conversion_error(exc, source, m.source)
        if isinstance(first, UnsupportedOpError):
            # the float route falls back to TorchScript (aten.lstm); its frontend cannot read PT2E's int8
            # weights ("could not find quantization parameters"), so this route has no such fallback
            head = str(first).split(";")[0]
            head += ")" * max(0, head.count("(") - head.count(")"))
            raise UnsupportedOpError(
                f"{head}; W8A8 off macOS goes through coremltools' torch.export frontend, "
                "which lacks it (its TorchScript frontend has it but cannot read PT2E's int8 weights): a "
                "limitation of edgekit's W8A8 route, not of Core ML; run this conversion on a Mac, or choose "
                "int8-weight or fp16") from None
        raise first from None
    if m.kind == "torchscript":
        source, route = m.torch_module, "TorchScript"
    else:
        ep = m.exported
        if ep is None:
            example = tuple(torch.from_numpy(a) for a in m.example_feeds().values())
            try:
                ep = torch.export.export(m.torch_module, example)
            except Exception as exc:  # torch.export refuses some Python constructs: fall back
                job.warn(f"torch.export failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
                         "falling back to torch.jit.trace")
                ep = None
        if ep is not None:
            source = ep.run_decompositions({})
        else:
            with torch.no_grad():
                source = torch.jit.trace(m.torch_module, example)
            route = "torch.jit.trace (fallback)"
    def run(src):
        return ct.convert(src, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                          minimum_deployment_target=target, compute_precision=precision)

    try:
        mlmodel = run(source)
    except Exception as exc:  # coremltools raises NotImplementedError/ValueError/RuntimeError/AssertionError
        first = _conversion_error(exc, source if ep is not None else None, m.source)
        if ep is None:
            raise first from None
        # coremltools' torch.export frontend lacks ops its TorchScript frontend has (aten.lstm): try that
        example = tuple(torch.from_numpy(a) for a in m.example_feeds().values())
        try:
            with torch.no_grad():
                traced = torch.jit.trace(m.torch_module, example, check_trace=False)
            mlmodel = run(traced)
        except Exception:  # noqa: BLE001 - the torch.export route's error is the one to report
            raise first from None
        route = "torch.jit.trace (coremltools' torch.export frontend: " + str(first).split(";")[0][-120:] + ")"
        job.log(f"Core ML: {route}")
    return mlmodel, route


def coreml_dtype(dtype: str) -> str:
    """Core ML I/O type for a source tensor type: float32 stays (set explicitly, fp16 compute would make it
    fp16), integer inputs become int32 (Core ML has no int64 tensors)."""
    if dtype.startswith(("int", "uint", "bool")):
        return "int32"
    return "float32"


def coreml_names(names: list[str]) -> dict[str, str]:
    """Core ML feature names for the model's input / output names: MIL takes ``[A-Za-z_][A-Za-z0-9_]*``
    (coremltools' NameSanitizer would rename ``x.1`` or ``save_infer_model/scale_0.tmp_1`` silently; edgekit
    names them itself, the same way, and records the mapping as the manifest's ``runtime_name``)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for n in names:
        new = re.sub(r"[^A-Za-z0-9_]", "_", n)
        if re.match(r"[^A-Za-z_]", new):
            new = "_" + new
        if new in _MIL_RESERVED:
            new += "_workaround"
        base, k = new, 0
        while new in used:
            new, k = f"{base}_{k}", k + 1
        used.add(new)
        out[n] = new
    return out


_MIL_RESERVED = {"any", "bool", "program", "func", "tensor", "list", "dict", "tuple", "true", "false", "string",
                 "bf16", "fp16", "fp32", "fp64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "state"}


_UNSUPPORTED = [
    re.compile(r"Unsupported fx node (?P<node>\S+), kind (?P<op>\S+)"),
    re.compile(r"PyTorch convert function for op '(?P<op>[^']+)' not implemented"),
]


def _conversion_error(exc: Exception, ep: Any, source: str) -> Exception:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for pat in _UNSUPPORTED:
        hit = pat.search(str(exc))
        if not hit:
            continue
        op = hit.group("op").rstrip(",")
        node_name = hit.groupdict().get("node")
        node = _find_node(ep, node_name, op)
        where = ""
        target = op
        if node is not None:
            node_name = node.name
            target = str(node.target)
            where = _source_location(node)
        return UnsupportedOpError(
            f"{source}: Core ML (coremltools) cannot convert op {target}"
            + (f" at node {node_name!r}" if node_name else "")
            + (f", from {where}" if where else "")
            + "; replace it with supported ops in the model, or register a coremltools composite op "
            "(coremltools.converters.mil.frontend.torch.register_torch_op)"
        )
    return ConversionError(f"{source}: coremltools failed: {type(exc).__name__}: {msg[:300]}")


def _find_node(ep: Any, node_name: str | None, op: str) -> Any:
    if ep is None:
        return None
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    for n in nodes:
        if node_name and n.name == node_name:
            return n
    for n in nodes:
        if str(n.target).split(".")[1:2] == [op] or getattr(n.target, "__name__", "").split(".")[0] == op:
            return n
    return None


def _source_location(node: Any) -> str:
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if not frames:
        return ""
    path, line, fn, code = frames[-1]
    return f"{path}:{line} in {fn} ({code.strip()[:80]})"


