"""Keras / SavedModel -> ONNX (tf2onnx), so TensorFlow models reach every target, not only android.

android converts Keras natively (TFLiteConverter, :mod:`edgekit.tf_graph`). The other converters read ONNX
(TensorRT) or torch (coremltools, brevitas/hls4ml, which take ONNX through :mod:`edgekit.onnx_bridge`). So a
TensorFlow model for them is written to ONNX with tf2onnx from the same traced ConcreteFunction that is the
float reference, at the same static shapes, with the same input and output names; the ONNX file then goes the
way every ONNX model goes (prepared, checked by onnxruntime, bridged to torch where the converter needs it).
The ONNX graph is compared with TensorFlow on seeded inputs before anything converts it: a wrong translation
is refused here, naming tf2onnx, instead of verifying against itself.

Why tf2onnx (measured on fer's Keras 2 mini-Xception, TensorFlow 2.21 / Keras 3): it converts in 0.6 s and
matches TensorFlow to 3e-7; Keras 3's own ``model.export(format="onnx")`` calls tf2onnx for the TensorFlow
backend anyway, and the SavedModel case needs the function path. The NHWC input stays NHWC (tf2onnx puts
Transposes inside the graph; TensorRT and the torch converters fold or run them), so the user's data works
unchanged on every target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from edgekit.deps import require, version
from edgekit.errors import UnsupportedOpError
from edgekit.tf_graph import TF_EXTRA, import_tensorflow, tf_arg_name

OPSET = 17  # TensorRT 10's parser and onnxruntime 1.2x take it; LayerNormalization is a single op from 17


def tf2onnx_version() -> str | None:
    return version("tf2onnx")


def to_onnx_model(model: Any, load_onnx: Callable[..., Any]) -> Any:
    """A Keras / SavedModel :class:`~edgekit.ingest.Model` as an ONNX Model (kind ``onnx``), checked against
    TensorFlow. Its source, digest and input layout stay the TensorFlow model's. ``load_onnx(path, shapes)`` is
    ingest's ONNX loader (passed in: ingest imports this module, not the other way round)."""
    from edgekit.onnx_bridge import differs
    from edgekit.onnx_prepare import scratch_dir
    from edgekit.quiet import capture_fd2, quiet_loggers

    tf = import_tensorflow()
    tf2onnx = require("tf2onnx", TF_EXTRA)
    onnx = require("onnx")
    sig = [tf.TensorSpec(s.shape, s.dtype, name=tf_arg_name(s.name, i)) for i, s in enumerate(model.inputs)]
    fn = model.tf_function
    traced = tf.function(lambda *xs: fn(*xs), input_signature=sig, autograph=False)
    try:
        with capture_fd2(replay_on_error=True), quiet_loggers("tf2onnx", "tensorflow"):
            proto, _ = tf2onnx.convert.from_function(traced, input_signature=sig, opset=OPSET)
    except Exception as exc:  # tf2onnx raises many types for ops it has no handler for
        raise UnsupportedOpError(
            f"{model.source}: tf2onnx {tf2onnx_version()} cannot write the model as ONNX ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); a limitation of the TensorFlow -> ONNX bridge, "
            "not of the target: convert for --target android (TFLiteConverter reads it directly)") from None
    _rename(proto, [i.name for i in proto.graph.input], [s.name for s in model.inputs])
    _rename(proto, [o.name for o in proto.graph.output], [s.name for s in model.outputs])
    path = scratch_dir() / f"{model.sha256[:16]}-tf2onnx.onnx"
    onnx.save(proto, str(path))
    got = load_onnx(path, [])
    feeds = model.seeded_feeds(2)
    for o, a, b in zip(model.outputs, got.reference()(feeds), model.reference()(feeds), strict=True):
        why = differs(a, b)
        if why:
            raise UnsupportedOpError(
                f"{model.source}: the TensorFlow -> ONNX bridge (tf2onnx {tf2onnx_version()}) computes output "
                f"{o.name!r} differently from TensorFlow ({why}); a limitation of the bridge: convert for "
                "--target android")
    inputs = [dataclasses.replace(g, layout=s.layout) for g, s in zip(got.inputs, model.inputs, strict=True)]
    return dataclasses.replace(got, source=model.source, sha256=model.sha256, inputs=inputs,
                               bridge=f"tf2onnx {tf2onnx_version()}")


def _rename(proto: Any, old: list[str], new: list[str]) -> None:
    """Give graph inputs / outputs the TensorFlow model's names (golden files, --eval and the bundle use them)."""
    names = dict(zip(old, new, strict=True))
    names = {a: b for a, b in names.items() if a != b}
    if not names:
        return
    g = proto.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        vi.name = names.get(vi.name, vi.name)
    for node in g.node:
        for i, n in enumerate(node.input):
            if n in names:
                node.input[i] = names[n]
        for i, n in enumerate(node.output):
            if n in names:
                node.output[i] = names[n]

