"""Ingest: a model file or ``pkg.module:factory`` -> :class:`Model`.

Kinds: torch ExportedProgram (``.pt2``), TorchScript (``.pt``/``.pth`` zip with code),
ONNX (``.onnx``), a factory returning an ``nn.Module`` (with ``--input-shape``), a
pickled ``nn.Module`` only with ``trust_pickle=True`` (``torch.load`` runs code from the
file; the default is weights-only), and Keras (``.keras``, ``.h5``) or a TensorFlow
SavedModel folder (holds ``saved_model.pb``), read with TensorFlow (``edgekit[keras]``).
The input spec (names, shapes, dtypes, layout) is fixed here; every later stage reads it
from the Model.
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
from edgekit.errors import InputSpecError, ModelLoadError, UnsupportedInputError
from edgekit.fsutil import sha256_file
from edgekit.quiet import first_line, quiet_loggers
from edgekit.tf_graph import TF_EXTRA, import_tensorflow, tf_arg_name

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str | None = None  # "nhwc" for image inputs of Keras / TensorFlow models; None = as given (torch: NCHW)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.layout:
            d["layout"] = self.layout
        return d


TORCH_KINDS = ("exported_program", "torchscript", "factory", "pickle")
TF_KINDS = ("keras", "saved_model")
KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


@dataclass
class Model:
    source: str
    kind: str  # exported_program | torchscript | onnx | factory | pickle | keras | saved_model
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec] = field(default_factory=list)
    torch_module: Any = None  # callable torch module (eval mode) for torch kinds
    exported: Any = None  # torch.export.ExportedProgram when known
    onnx_path: Path | None = None  # float ONNX, for onnx kind or once exported
    tf_model: Any = None  # keras.Model, or the object tf.saved_model.load returned (keeps its variables alive)
    tf_function: Any = None  # tf ConcreteFunction: positional inputs (static shapes) -> tuple of outputs
    onnx_prep: Any = None  # edgekit.onnx_bridge.Prepared: how an ONNX file was made static (steps, consts)
    bridge: str | None = None  # "onnx2torch 1.5.15": an ONNX model rebuilt in torch for a torch-only converter
    _reference: Any = field(default=None, repr=False, compare=False)  # made once: an ONNX model's is a session

    @property
    def is_torch(self) -> bool:
        return self.kind in TORCH_KINDS

    @property
    def is_tf(self) -> bool:
        return self.kind in TF_KINDS

    def reference(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        """The float model as a function of named numpy inputs (one batch); made once per Model (the
        data and verify stages both run it; for ONNX it holds an onnxruntime session)."""
        if self._reference is None:
            self._reference = self._make_reference()
        return self._reference

    def _make_reference(self) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
        if self.is_tf:
            tf = import_tensorflow()
            fn = self.tf_function

            def run_tf(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                outs = fn(*[tf.constant(np.ascontiguousarray(feeds[s.name], dtype=s.dtype)) for s in self.inputs])
                return [np.asarray(o) for o in outs]

            return run_tf
        if self.is_torch and self.bridge is None:  # a bridged ONNX model's reference stays onnxruntime
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

    def seeded_feeds(self, seed: int) -> dict[str, np.ndarray]:
        """Seeded inputs for comparing two forms of the model (float inputs uniform in [0, 1), others zero)."""
        rng = np.random.default_rng(seed)
        return {s.name: (rng.random(s.shape) if s.dtype.startswith("float") else np.zeros(s.shape)).astype(s.dtype)
                for s in self.inputs}


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
    consts: list[str] | None = None,
) -> Model:
    """Load ``source`` and fix its input spec. Raises :class:`ModelLoadError` on bad files.
    ``consts`` (``name=value``, ONNX only) folds inputs into the graph as constants."""
    shapes = parse_shapes(input_shapes)
    if consts and not str(source).lower().endswith(".onnx"):
        raise InputSpecError("--const folds an input of an ONNX model into its graph; this model is not ONNX "
                             "(fix the value in the model's code before exporting it)")
    src = str(source)
    path = Path(src)
    if not path.exists() and FACTORY_RE.match(src):
        return _load_factory(src, shapes)
    if not path.exists():
        raise ModelLoadError(f"{src}: no such file (give a model file or pkg.module:factory)")
    if path.is_dir():
        if (path / "saved_model.pb").is_file():
            return _load_saved_model(path, shapes, trust_pickle)
        raise ModelLoadError(
            f"{src} is a folder without saved_model.pb; give the model file (.pt2, .onnx, .pt, .keras, .h5) "
            "or a TensorFlow SavedModel folder"
        )
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{src} is empty; re-save the model")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return _load_onnx(path, shapes, consts)
    if suffix in (".pt2", ".pt", ".pth", ".ts", ".torchscript", ".jit"):
        return _load_torch_file(path, shapes, trust_pickle)
    if suffix in KERAS_SUFFIXES:
        return _load_keras(path, shapes, trust_pickle)
    raise ModelLoadError(
        f"{src}: unknown model file type {suffix or '(none)'}; edgekit reads .pt2 (torch.export), "
        ".pt/.pth (TorchScript or, with --trust-pickle, a pickled module), .onnx, .keras/.h5 (Keras), "
        "a SavedModel folder, or pkg.module:factory"
    )


def source_kind(source: str | Path) -> str | None:
    """The TensorFlow kind a path will load as ("keras", "saved_model"), from its name alone; else None."""
    path = Path(str(source))
    if path.is_dir():
        return "saved_model" if (path / "saved_model.pb").is_file() else None
    return "keras" if path.suffix.lower() in KERAS_SUFFIXES else None


def check_target_takes(model: Model | str | Path, target: Any) -> None:
    """Refuse a model kind the target's converter does not take (the converter registry says which).
    Takes a loaded Model, or a path (checked by name, before TensorFlow is imported, for Keras / SavedModel)."""
    from edgekit.converters import CONVERTERS, converter_info

    kind, source = (model.kind, model.source) if isinstance(model, Model) else (source_kind(model), str(model))
    if kind is None and not isinstance(model, Model) and str(model).lower().endswith(".onnx"):
        kind = "onnx"
    if kind is None or target is None:
        return
    info = converter_info(target.converter)
    if _takes(info, kind):
        return
    from edgekit.profiles import list_targets

    takers = sorted(t.name for t in list_targets() if _takes(CONVERTERS[t.converter], kind))
    what = {"keras": "Keras", "saved_model": "SavedModel", "onnx": "ONNX"}.get(kind, kind)
    fix = info.inputs_hint or "export it to a format the target takes"
    raise UnsupportedInputError(
        f"{source}: {what} input is supported for --target {', '.join(takers) or '(none)'} only, not "
        f"{target.name} (its converter {target.converter!r} takes {', '.join(info.inputs)}: a limitation of "
        f"edgekit's converters, not of the target); {fix}"
    )


def takes_via_bridge(info: Any) -> bool:
    """A converter that reads torch takes ONNX through the onnx2torch bridge (edgekit.onnx_bridge)."""
    return "onnx" not in info.inputs and "exported_program" in info.inputs


def _takes(info: Any, kind: str) -> bool:
    """Whether a converter takes a model kind, itself or through a bridge (ONNX -> torch, TensorFlow -> ONNX)."""
    return kind in info.inputs or (kind == "onnx" and takes_via_bridge(info)) or (kind in TF_KINDS and takes_onnx(info))


def takes_onnx(info: Any) -> bool:
    """A converter that reads ONNX, directly or through the onnx2torch bridge (so a TensorFlow model reaches it
    through tf2onnx: edgekit.tf_bridge)."""
    return "onnx" in info.inputs or takes_via_bridge(info)


def for_converter(model: Model, target: Any, keras_via_onnx: bool = False) -> Model:
    """The model as the target's converter reads it: a Keras / SavedModel model written to ONNX (tf2onnx) where
    the converter does not read TensorFlow, or where ``keras_via_onnx`` asks for it (android ``--option
    keras=onnx``); an ONNX model bridged to torch where the converter takes torch but not ONNX; otherwise the
    model itself."""
    from edgekit.converters import converter_info

    if target is None:
        return model
    info = converter_info(target.converter)
    if model.is_tf and (model.kind not in info.inputs or keras_via_onnx) and takes_onnx(info):
        from edgekit.tf_bridge import to_onnx_model

        model = to_onnx_model(model, _load_onnx)
    if model.kind == "onnx" and takes_via_bridge(info):
        import dataclasses

        from edgekit.onnx_bridge import bridge_model

        first = model.bridge  # "tf2onnx x.y" for a TensorFlow model
        model = bridge_model(model, model.source)
        if first:
            model = dataclasses.replace(model, bridge=f"{first} + {model.bridge}")
    return model


# ---------------------------------------------------------------- torch


def _load_torch_file(path: Path, shapes, trust_pickle: bool) -> Model:
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
        raise _does_not_run(model, exc, "check --input-shape") from None
    outs = _flatten(out)
    model.outputs = [
        TensorSpec(f"output_{i}" if len(outs) > 1 else "output", tuple(o.shape), str(o.dtype).replace("torch.", ""))
        for i, o in enumerate(outs)
    ]
    return model


# ---------------------------------------------------------------- onnx

def _load_onnx(path: Path, shapes, consts: list[str] | None = None) -> Model:
    """An ONNX file, prepared (edgekit.onnx_bridge.prepare): every input static, ``--const`` inputs folded,
    opset >= 13, constants folded. The prepared graph is what the targets convert and the float reference
    runs; it is checked against the file as given (onnxruntime, seeded inputs) before anything uses it."""
    from edgekit.onnx_bridge import ONNX_DTYPES, parse_consts, prepare, save_prepared

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
    const_values = parse_consts(consts)
    given_dtypes = {i.name: ONNX_DTYPES.get(i.type.tensor_type.elem_type, "float32") for i in proto.graph.input}
    prep = prepare(path, proto, shapes, const_values)  # edits proto
    prepared = save_prepared(prep, digest)
    inputs = [TensorSpec(n, s, d) for n, s, d in prep.inputs]
    outputs = [TensorSpec(vo.name, tuple(d.dim_value if d.HasField("dim_value") else -1
                                        for d in vo.type.tensor_type.shape.dim),
                          ONNX_DTYPES.get(vo.type.tensor_type.elem_type, "float32"))
               for vo in prep.proto.graph.output]
    model = Model(str(path), "onnx", digest, inputs, outputs, onnx_path=prepared, onnx_prep=prep)
    feeds = model.seeded_feeds(0)
    try:
        outs = model.reference()(feeds)
    except Exception as exc:
        raise ModelLoadError(
            f"{path}: onnxruntime cannot run the model at the given shapes ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:240]}); check --input-shape / --const"
        ) from None
    if not prep.quantized_ops:  # the prepared graph must compute what the file computes
        ort = require("onnxruntime")
        given = dict(feeds)
        given.update({k: np.asarray(v, dtype=given_dtypes[k]) for k, v in prep.consts.items()})
        try:
            orig = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            want = orig.run(None, {k: v for k, v in given.items() if k in {i.name for i in orig.get_inputs()}})
        except Exception as exc:
            raise ModelLoadError(f"{path}: onnxruntime cannot run the file as given ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200]})") from None
        for o, a, b in zip(outputs, outs, want, strict=True):
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True):
                raise ModelLoadError(
                    f"{path}: preparing the graph ({'; '.join(prep.steps)}) changed output {o.name!r} "
                    f"(max difference {float(np.max(np.abs(a.astype(np.float64) - b))) if a.shape == b.shape else 'shape'}); "
                    "a limitation of edgekit's ONNX preparation: report it with the model")
    model.outputs = [TensorSpec(o.name, tuple(a.shape), str(a.dtype)) for o, a in zip(outputs, outs, strict=True)]
    return model


# ---------------------------------------------------------------- Keras / TensorFlow SavedModel



def _load_keras(path: Path, shapes, trust_pickle: bool = False) -> Model:
    if path.suffix.lower() == ".keras" and not zipfile.is_zipfile(path):  # checked before importing TensorFlow
        raise ModelLoadError(
            f"{path}: not a Keras archive (a .keras file is a zip; this one is truncated or another format); "
            "re-save it with model.save('model.keras')"
        )
    import_tensorflow()
    keras = require("keras", TF_EXTRA)
    digest = sha256_file(path)
    try:
        # safe_mode: a Lambda layer's Python bytecode is not deserialized (Keras refuses it) unless trusted
        km = keras.models.load_model(str(path), compile=False, safe_mode=not trust_pickle)
    except Exception as exc:  # keras / h5py raise many types for damaged or foreign files
        if "safe_mode" in str(exc) or "Lambda" in str(exc):
            raise ModelLoadError(
                f"{path}: the model holds a Lambda layer (Python code that loading would run); "
                "pass --trust-pickle if you trust its source, or replace the Lambda with a built-in layer"
            ) from None
        raise ModelLoadError(
            f"{path}: Keras cannot load the model ({type(exc).__name__}: {first_line(exc)}); "
            "is the file complete? re-save it with model.save('model.keras')"
        ) from None
    try:
        graph_inputs = list(km.inputs or [])
    except (AttributeError, ValueError):
        graph_inputs = []
    if not graph_inputs and not shapes:
        raise InputSpecError(
            f"{path}: the Keras model has no defined input (a Sequential without keras.Input); "
            "give --input-shape (NHWC, e.g. 1,224,224,3)"
        )
    if graph_inputs:
        found = [(_clean_name(getattr(t, "name", None), i), tuple(t.shape), str(getattr(t, "dtype", "float32")))
                 for i, t in enumerate(graph_inputs)]
    else:
        found = [(name or f"input_{i}", tuple(None for _ in shape), "float32") for i, (name, shape) in enumerate(shapes)]
    inputs = _tf_inputs(str(path), found, shapes)
    channels_first = any(getattr(layer, "data_format", None) == "channels_first" for layer in _keras_layers(km))
    inputs = [TensorSpec(s.name, s.shape, s.dtype, None if channels_first or len(s.shape) != 4 else "nhwc")
              for s in inputs]

    def call(*xs):
        return km(list(xs) if len(xs) > 1 else xs[0], training=False)

    model = Model(str(path), "keras", digest, inputs, tf_model=km)
    return _finish_tf(model, call, None)


def _keras_layers(km: Any) -> list[Any]:
    try:
        return list(km._flatten_layers(include_self=False))
    except Exception:  # noqa: BLE001 - older / other Model classes
        return list(getattr(km, "layers", []))


def _load_saved_model(path: Path, shapes, trust_pickle: bool = False) -> Model:
    from edgekit.fsutil import sha256_tree
    from edgekit.safety import check_saved_model

    tf = import_tensorflow()
    check_saved_model(path, str(path), trust_pickle)  # a graph that touches files or calls Python: trusted only
    digest = sha256_tree(path)
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        why = first_line(exc)
        if "add_slot" in why or "_UserObject" in why:  # a Keras 2 (tf.keras) model saved with its optimizer
            import os

            legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
            raise ModelLoadError(
                f"{path}: this SavedModel was written by Keras 2 (tf.keras), which Keras 3 cannot read back "
                f"({type(exc).__name__}: {why[:120]}); " + (
                    "TF_USE_LEGACY_KERAS=1 is set: pip install tf-keras matching your TensorFlow" if legacy else
                    "pip install tf-keras matching your TensorFlow and run with TF_USE_LEGACY_KERAS=1")
            ) from None
        raise ModelLoadError(
            f"{path}: TensorFlow cannot load the SavedModel ({type(exc).__name__}: {why}); "
            "is the folder complete? re-export it (model.export(folder) or tf.saved_model.save)"
        ) from None
    sigs = dict(getattr(loaded, "signatures", {}) or {})
    if "serving_default" not in sigs:
        raise ModelLoadError(
            f"{path}: the SavedModel has no 'serving_default' signature (it has {sorted(sigs) or 'none'}); "
            "export it with model.export(folder) or tf.saved_model.save(obj, folder, signatures=...)"
        )
    sig = sigs["serving_default"]
    _, kw = sig.structured_input_signature
    names = sorted(kw)
    found = [(n, tuple(kw[n].shape.as_list() if kw[n].shape.rank is not None else ()), kw[n].dtype.name)
             for n in names]
    inputs = _tf_inputs(str(path), found, shapes)
    inputs = [TensorSpec(s.name, s.shape, s.dtype, "nhwc" if len(s.shape) == 4 else None) for s in inputs]
    out_names = sorted(sig.structured_outputs)

    def call(*xs):
        out = sig(**{n: x for n, x in zip(names, xs, strict=True)})
        return [out[k] for k in out_names]

    model = Model(str(path), "saved_model", digest, inputs, tf_model=loaded)
    return _finish_tf(model, call, out_names)


def _tf_inputs(source: str, found: list[tuple[str, tuple, str]], shapes) -> list[TensorSpec]:
    """Static input specs from the model's own (batch possibly None) shapes and --input-shape."""
    if shapes and len(shapes) != len(found):
        raise InputSpecError(f"{source}: the model has {len(found)} input(s), --input-shape gave {len(shapes)}")
    out = []
    for i, (name, dims, dtype) in enumerate(found):
        if shapes:
            shape = shapes[i][1]
            if dims and (len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape, strict=True))):
                raise InputSpecError(
                    f"{source}: input {name!r} has shape {[d if d is not None else '?' for d in dims]}, "
                    f"--input-shape {list(shape)} does not fit it"
                )
        elif dims and all(d is not None for d in dims[1:]):
            shape = (1 if dims[0] is None else dims[0], *dims[1:])  # dynamic batch: edge deployment runs batch 1
        else:
            raise InputSpecError(
                f"{source}: input {name!r} has dynamic dimensions {[d if d is not None else '?' for d in dims]}; "
                "give --input-shape (NHWC, e.g. 1,224,224,3)"
            )
        out.append(TensorSpec(name, tuple(int(d) for d in shape), dtype))
    return out


def _finish_tf(model: Model, call: Callable[..., Any], out_names: list[str] | None) -> Model:
    """Trace the model at the fixed input shapes into one ConcreteFunction (the float reference and
    what TFLiteConverter converts), run it once on zeros, and fix the output spec."""
    tf = import_tensorflow()
    sig = [tf.TensorSpec(s.shape, s.dtype, name=tf_arg_name(s.name, i)) for i, s in enumerate(model.inputs)]

    def flat(*xs):
        return tuple(tf.nest.flatten(call(*xs)))

    try:
        model.tf_function = tf.function(flat, input_signature=sig, autograph=False).get_concrete_function()
        outs = model.reference()(model.example_feeds())
    except Exception as exc:
        raise _does_not_run(model, exc, "check --input-shape (NHWC for Keras)") from None
    names = out_names if out_names and len(out_names) == len(outs) else (
        ["output"] if len(outs) == 1 else [f"output_{i}" for i in range(len(outs))])
    model.outputs = [TensorSpec(n, tuple(o.shape), str(o.dtype)) for n, o in zip(names, outs, strict=True)]
    return model


def _clean_name(name: str | None, i: int) -> str:
    return name if name else f"input_{i}"


def _does_not_run(model: Model, exc: BaseException, fix: str) -> InputSpecError:
    shapes = ", ".join(f"{s.name}{list(s.shape)}" for s in model.inputs)
    return InputSpecError(f"{model.source}: the model does not run on inputs {shapes} "
                          f"({type(exc).__name__}: {first_line(exc)}); {fix}")

