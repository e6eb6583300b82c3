"""Which model kinds a target's converter takes, itself or through a bridge (ONNX -> torch: edgekit.onnx_bridge;
TensorFlow -> ONNX: edgekit.tf_bridge), the refusal naming the targets that do take a kind, and the model as
the target's converter reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.errors import UnsupportedInputError
from edgekit.ingest_onnx import load_onnx
from edgekit.model import KERAS_SUFFIXES, TF_KINDS, Model


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

        model = to_onnx_model(model, load_onnx)
    if model.kind == "onnx" and takes_via_bridge(info):
        import dataclasses

        from edgekit.onnx_bridge import bridge_model

        first = model.bridge  # "tf2onnx x.y" for a TensorFlow model
        model = bridge_model(model, model.source)
        if first:
            model = dataclasses.replace(model, bridge=f"{first} + {model.bridge}")
    return model
