"""ONNX models in: the file checked, prepared (edgekit.onnx_prepare), and the prepared graph checked against the
file as given before anything uses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.deps import require
from edgekit.errors import ModelLoadError
from edgekit.fsutil import sha256_file
from edgekit.model import Model, TensorSpec


def load_onnx(path: Path, shapes, consts: list[str] | None = None,
              batch_axes: dict[str, int | None] | None = None) -> Model:
    """An ONNX file, prepared (edgekit.onnx_prepare.prepare): every input static, ``--const`` inputs folded,
    opset >= 13, constants folded. The prepared graph is what the targets convert and the float reference
    runs; it is checked against the file as given (onnxruntime, seeded inputs) before anything uses it."""
    from edgekit.onnx_prepare import ONNX_DTYPES, parse_consts, prepare, save_prepared

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
    prep = prepare(path, proto, shapes, const_values, batch_axes)  # edits proto
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
