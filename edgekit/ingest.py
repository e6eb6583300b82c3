"""Ingest: a model file or ``pkg.module:factory`` -> :class:`Model`.

Kinds: torch ExportedProgram (``.pt2``), TorchScript (``.pt``/``.pth`` zip with code),
ONNX (``.onnx``), a factory returning an ``nn.Module`` (with ``--input-shape``), and a
pickled ``nn.Module`` only with ``trust_pickle=True`` (``torch.load`` runs code from the
file; the default is weights-only). The input spec (names, shapes, dtypes) is fixed
here; every later stage reads it from the Model.
"""

from __future__ import annotations

import importlib
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.deps import require
from edgekit.errors import InputSpecError, ModelLoadError
from edgekit.fsutil import sha256_file

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class Model:
    source: str
    kind: str  # exported_program | torchscript | onnx | factory | pickle
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec] = field(default_factory=list)
    torch_module: Any = None  # callable torch module (eval mode) for torch kinds
    exported: Any = None  # torch.export.ExportedProgram when known
    onnx_path: Path | None = None  # float ONNX, for onnx kind or once exported

    @property
    def is_torch(self) -> bool:
        return self.kind != "onnx"

    def reference(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """The float model as a function of named numpy inputs (one batch)."""
        if self.is_torch:
            torch = require("torch")
            mod = self.torch_module

            def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                with torch.no_grad():
                    out = mod(*[torch.from_numpy(np.ascontiguousarray(feeds[s.name])) for s in self.inputs])
                return [o.detach().cpu().numpy() for o in _flatten(out)]

            return run
        ort = require("onnxruntime")
        sess = ort.InferenceSession(str(self.onnx_path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]

        def run_onnx(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return list(sess.run(names, feeds))

        return run_onnx

    def example_feeds(self) -> dict[str, np.ndarray]:
        return {s.name: np.zeros(s.shape, dtype=s.dtype) for s in self.inputs}


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return [y for x in out for y in _flatten(x)]
    if isinstance(out, dict):
        return [y for x in out.values() for y in _flatten(x)]
    return [out]


def parse_shapes(specs: list[str] | None) -> list[tuple[str | None, tuple[int, ...]]]:
    """``--input-shape 1,3,224,224`` or ``image:1,3,224,224`` (repeat per input)."""
    out = []
    for spec in specs or []:
        name, _, dims = spec.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            raise InputSpecError(f"--input-shape {spec!r}: expected e.g. 1,3,224,224 or image:1,3,224,224") from None
        if not shape or any(d <= 0 for d in shape):
            raise InputSpecError(f"--input-shape {spec!r}: every dimension must be a positive integer")
        out.append((name or None, shape))
    return out


def load_model(
    source: str | Path,
    input_shapes: list[str] | None = None,
    trust_pickle: bool = False,
) -> Model:
    """Load ``source`` and fix its input spec. Raises :class:`ModelLoadError` on bad files."""
    shapes = parse_shapes(input_shapes)
    src = str(source)
    path = Path(src)
    if not path.exists() and FACTORY_RE.match(src):
        return _load_factory(src, shapes)
    if not path.exists():
        raise ModelLoadError(f"{src}: no such file (give a model file or pkg.module:factory)")
    if path.is_dir():
        raise ModelLoadError(f"{src} is a folder; give the model file (.pt2, .onnx, .pt)")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{src} is empty; re-save the model")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return _load_onnx(path, shapes)
    if suffix in (".pt2", ".pt", ".pth", ".ts", ".torchscript", ".jit"):
        return _load_torch_file(path, shapes, trust_pickle)
    raise ModelLoadError(
        f"{src}: unknown model file type {suffix or '(none)'}; edgekit reads .pt2 (torch.export), "
        ".pt/.pth (TorchScript or, with --trust-pickle, a pickled module), .onnx, or pkg.module:factory"
    )


# ---------------------------------------------------------------- torch


def _load_torch_file(path: Path, shapes, trust_pickle: bool) -> Model:
    torch = require("torch")
    digest = sha256_file(path)
    if not zipfile.is_zipfile(path):
        raise ModelLoadError(
            f"{path}: not a torch archive (a .pt2/.pt file is a zip; this one is truncated or another format); "
            "re-save it with torch.export.save or torch.jit.save"
        )
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    is_ep = any(n.split("/", 1)[-1].startswith(("models/", "serialized_exported_program")) for n in names) or any(
        "/models/" in n or n.endswith("archive_format") for n in names
    )
    is_ts = any(n.split("/", 1)[-1].startswith("code/") for n in names)
    if is_ep:
        try:
            ep = torch.export.load(str(path))
        except Exception as exc:  # torch raises many types for damaged archives
            raise ModelLoadError(
                f"{path}: cannot read the ExportedProgram ({type(exc).__name__}: {str(exc)[:200]}); "
                "is the file complete? re-export with torch.export.save"
            ) from None
        return _from_exported(str(path), digest, ep, shapes)
    if is_ts:
        try:
            mod = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot read TorchScript ({type(exc).__name__}: {str(exc)[:200]})") from None
        mod.eval()
        inputs = _inputs_from_shapes(shapes, path, _ts_input_names(mod))
        return _finish_torch(Model(str(path), "torchscript", digest, inputs, torch_module=mod))
    # a plain pickle inside a zip: weights-only unless trusted
    if not trust_pickle:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelLoadError(
                f"{path}: holds pickled Python objects, not only weights ({str(exc).splitlines()[0][:160]}); "
                "loading it would run code from the file: pass --trust-pickle if you trust its source, "
                "or save the model with torch.export.save"
            ) from None
        raise ModelLoadError(
            f"{path}: holds only weights ({type(obj).__name__}), not a model; "
            "give the model as pkg.module:factory or save it with torch.export.save"
        )
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ModelLoadError(f"{path}: torch.load failed ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(obj, torch.nn.Module):
        raise ModelLoadError(f"{path}: holds a {type(obj).__name__}, not an nn.Module")
    obj.eval()
    inputs = _inputs_from_shapes(shapes, path, _forward_names(obj))
    return _finish_torch(Model(str(path), "pickle", digest, inputs, torch_module=obj))


def _from_exported(source: str, digest: str, ep: Any, shapes) -> Model:
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = []
    for i, name in enumerate(user):
        val = placeholders[name].meta.get("val")
        dims = tuple(val.shape) if val is not None else ()
        static = all(isinstance(d, int) for d in dims)
        dtype = str(val.dtype).replace("torch.", "") if val is not None else "float32"
        inputs.append(TensorSpec(name, tuple(int(d) for d in dims) if static else (), dtype))
    if shapes:
        if len(shapes) != len(inputs):
            raise InputSpecError(f"{source}: the model has {len(inputs)} input(s), --input-shape gave {len(shapes)}")
        for i, (spec, (_, shape)) in enumerate(zip(inputs, shapes, strict=True)):
            if spec.shape and spec.shape != shape:
                raise InputSpecError(
                    f"{source}: input {spec.name!r} was exported with static shape {list(spec.shape)}, "
                    f"--input-shape asks for {list(shape)}; re-export with that shape or drop --input-shape"
                )
            inputs[i] = TensorSpec(spec.name, shape, spec.dtype)
    for spec in inputs:
        if not spec.shape:
            raise InputSpecError(
                f"{source}: input {spec.name!r} has dynamic dimensions; give --input-shape (e.g. 1,3,224,224)"
            )
    model = Model(source, "exported_program", digest, inputs, torch_module=ep.module(), exported=ep)
    return _finish_torch(model)


def _load_factory(spec: str, shapes) -> Model:
    torch = require("torch")
    mod_name, fn_name = spec.split(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ModelLoadError(f"{spec}: cannot import module {mod_name!r} ({exc}); is it on PYTHONPATH?") from None
    factory = getattr(module, fn_name, None)
    if not callable(factory):
        raise ModelLoadError(f"{spec}: {mod_name} has no callable {fn_name!r}")
    obj = factory()
    if not isinstance(obj, torch.nn.Module):
        raise ModelLoadError(f"{spec}: the factory returned a {type(obj).__name__}, not a torch.nn.Module")
    obj.eval()
    inputs = _inputs_from_shapes(shapes, spec, _forward_names(obj))
    digest = _module_digest(obj, spec)
    return _finish_torch(Model(spec, "factory", digest, inputs, torch_module=obj))


def _module_digest(mod: Any, spec: str) -> str:
    import hashlib

    h = hashlib.sha256(spec.encode())
    for k, v in mod.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _forward_names(mod: Any) -> list[str]:
    import inspect

    try:
        params = list(inspect.signature(mod.forward).parameters.values())
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _ts_input_names(mod: Any) -> list[str]:
    try:
        args = mod.forward.schema.arguments[1:]
        return [a.name for a in args]
    except Exception:
        return []


def _inputs_from_shapes(shapes, source, names: list[str]) -> list[TensorSpec]:
    if not shapes:
        raise InputSpecError(f"{source}: this model kind carries no input shape; give --input-shape (e.g. 1,3,224,224)")
    out = []
    for i, (name, shape) in enumerate(shapes):
        out.append(TensorSpec(name or (names[i] if i < len(names) else f"input_{i}"), shape, "float32"))
    return out


def _finish_torch(model: Model) -> Model:
    """Run the model once on zeros: checks the input spec and fixes the output spec."""
    torch = require("torch")
    feeds = model.example_feeds()
    try:
        with torch.no_grad():
            out = model.torch_module(*[torch.from_numpy(feeds[s.name]) for s in model.inputs])
    except Exception as exc:
        shapes = ", ".join(f"{s.name}{list(s.shape)}" for s in model.inputs)
        raise InputSpecError(
            f"{model.source}: the model does not run on inputs {shapes} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); check --input-shape"
        ) from None
    outs = _flatten(out)
    model.outputs = [
        TensorSpec(f"output_{i}" if len(outs) > 1 else "output", tuple(o.shape), str(o.dtype).replace("torch.", ""))
        for i, o in enumerate(outs)
    ]
    return model


# ---------------------------------------------------------------- onnx

_ONNX_DTYPES = {1: "float32", 10: "float16", 11: "float64", 7: "int64", 6: "int32", 3: "int8", 2: "uint8", 9: "bool"}


def _load_onnx(path: Path, shapes) -> Model:
    onnx = require("onnx")
    digest = sha256_file(path)
    try:
        proto = onnx.load(str(path))
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: not a valid ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "is the file complete? re-export it"
        ) from None
    init_names = {i.name for i in proto.graph.initializer}
    graph_inputs = [i for i in proto.graph.input if i.name not in init_names]
    if shapes and len(shapes) != len(graph_inputs):
        raise InputSpecError(f"{path}: the model has {len(graph_inputs)} input(s), --input-shape gave {len(shapes)}")
    inputs = []
    for i, vi in enumerate(graph_inputs):
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        dtype = _ONNX_DTYPES.get(tt.elem_type, f"onnx-type-{tt.elem_type}")
        if shapes:
            shape = shapes[i][1]
            fixed = [d for d in dims]
            if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(fixed, shape, strict=False)):
                raise InputSpecError(
                    f"{path}: input {vi.name!r} has shape {[d if d else '?' for d in dims]}, "
                    f"--input-shape {list(shape)} does not fit it"
                )
        elif all(d is not None for d in dims):
            shape = tuple(dims)
        elif dims and dims[0] is None and all(d is not None for d in dims[1:]):
            shape = (1, *dims[1:])  # dynamic batch: edge deployment runs batch 1
        else:
            raise InputSpecError(
                f"{path}: input {vi.name!r} has dynamic dimensions {[d if d else '?' for d in dims]}; "
                "give --input-shape"
            )
        inputs.append(TensorSpec(vi.name, tuple(int(d) for d in shape), dtype))
    outputs = []
    for vo in proto.graph.output:
        tt = vo.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
        outputs.append(TensorSpec(vo.name, dims, _ONNX_DTYPES.get(tt.elem_type, "float32")))
    model = Model(str(path), "onnx", digest, inputs, outputs, onnx_path=path)
    try:
        outs = model.reference()(model.example_feeds())
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: onnxruntime cannot run the model ({type(exc).__name__}: {str(exc).splitlines()[0][:240]})"
        ) from None
    model.outputs = [TensorSpec(o.name, tuple(a.shape), str(a.dtype)) for o, a in zip(outputs, outs, strict=True)]
    return model
