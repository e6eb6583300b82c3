"""Torch models in: an ExportedProgram (``.pt2``), TorchScript (``.pt``/``.pth`` zip with code), a pickled
``nn.Module`` (only with ``trust_pickle``: ``torch.load`` runs code from the file; the default is weights-only),
or ``pkg.module:factory`` returning an ``nn.Module``. Each is run once on zeros to check its input spec and fix
its output spec."""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path
from typing import Any

from edgekit.deps import require
from edgekit.errors import InputSpecError, ModelLoadError
from edgekit.fsutil import sha256_file
from edgekit.input_spec import does_not_run, inputs_from_shapes
from edgekit.model import Model, TensorSpec, flatten_outputs
from edgekit.quiet import first_line, quiet_loggers


def load_torch_file(path: Path, shapes, trust_pickle: bool) -> Model:
    """A .pt2 / .pt / .pth file: an ExportedProgram, TorchScript, or (trusted only) a pickled module."""
    from edgekit.safety import check_torch_archive

    if not zipfile.is_zipfile(path):
        raise ModelLoadError(
            f"{path}: not a torch archive (a .pt2/.pt file is a zip; this one is truncated or another format); "
            "re-save it with torch.export.save or torch.jit.save"
        )
    torch = require("torch")
    digest = sha256_file(path)
    with open(path, "rb") as f:  # one open file: the bytes checked are the bytes torch reads
        # CRCs, pickled members (no global outside torch's weights-only allowlist), shape expressions
        check_torch_archive(f, str(path), trust_pickle)
        f.seek(0)
        with zipfile.ZipFile(f) as zf:
            names = zf.namelist()
        f.seek(0)
        is_ep = any(n.split("/", 1)[-1].startswith(("models/", "serialized_exported_program")) for n in names) or any(
            "/models/" in n or n.endswith("archive_format") for n in names
        )
        is_ts = any(n.split("/", 1)[-1].startswith("code/") for n in names)
        if is_ep:
            try:
                with quiet_loggers("torch", "torch._export", "torch.export"):
                    ep = torch.export.load(f)
            except Exception as exc:  # torch raises many types for damaged archives
                why = first_line(exc).replace(" Please check the warnings above for possible errors.", "")
                raise ModelLoadError(
                    f"{path}: cannot read the ExportedProgram ({type(exc).__name__}: {why[:200]}); "
                    "is the file complete? re-export with torch.export.save"
                ) from None
            return _from_exported(str(path), digest, ep, shapes)
        if is_ts:
            try:
                with quiet_loggers("torch", "torch._export", "torch.export"):
                    mod = torch.jit.load(f, map_location="cpu")
            except Exception as exc:
                raise ModelLoadError(
                    f"{path}: cannot read TorchScript ({type(exc).__name__}: {first_line(exc)[:200]}); "
                    "is the file complete? re-save it with torch.jit.save") from None
            mod.eval()
            inputs = inputs_from_shapes(shapes, path, _ts_input_names(mod))
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
    inputs = inputs_from_shapes(shapes, path, _forward_names(obj))
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


def load_factory(spec: str, shapes) -> Model:
    """``pkg.module:factory``: the module the factory returns, at the --input-shape given."""
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
    inputs = inputs_from_shapes(shapes, spec, _forward_names(obj))
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


def _finish_torch(model: Model) -> Model:
    """Run the model once on zeros: checks the input spec and fixes the output spec."""
    torch = require("torch")
    feeds = model.example_feeds()
    try:
        with torch.no_grad():
            out = model.torch_module(*[torch.from_numpy(feeds[s.name]) for s in model.inputs])
    except Exception as exc:
        raise does_not_run(model, exc, "check --input-shape") from None
    outs = flatten_outputs(out)
    model.outputs = [
        TensorSpec(f"output_{i}" if len(outs) > 1 else "output", tuple(o.shape), str(o.dtype).replace("torch.", ""))
        for i, o in enumerate(outs)
    ]
    return model
