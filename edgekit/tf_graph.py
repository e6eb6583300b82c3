"""TensorFlow float graphs in the core: Keras / SavedModel models -> ``.tflite`` with TensorFlow's
TFLiteConverter. The analyze stage writes the fp32 ``.tflite`` it analyzes with it, and the android
converter writes every precision with it; so it lives here, beside ``onnx_graph.py``, not in a converter."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

from edgekit.deps import require
from edgekit.errors import ConversionError, InputSpecError
from edgekit.quiet import capture_fd2, quiet_python
from edgekit.tflite_graph import TFLiteGraph, text

TF_EXTRA = "keras"


def import_tensorflow() -> Any:
    """TensorFlow, imported on first use (``edgekit[keras]``); its C++ INFO/WARNING logs kept quiet."""
    import os
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if sys.modules.get("tensorflow") is not None:
        return sys.modules["tensorflow"]
    with capture_fd2(replay_on_error=True):  # absl prints oneDNN / InitializeLog lines at import, whatever
        tf = require("tensorflow", TF_EXTRA)  # TF_CPP_MIN_LOG_LEVEL says
        # the devices are found here, not at the first op: the tensorflow wheel (GPU-capable, which tf-keras
        # installs) says "failed call to cuInit" at ERROR level on a machine without a GPU driver
        tf.config.list_physical_devices()
        return tf


def tf_convert(model: Any, dest: Path, precision: str, calib: Any = None, work_dir: Path | None = None,
               allow_float_fallback: bool = False, log=lambda m: None) -> dict[str, Any]:
    """Write ``dest`` from a Keras / SavedModel Model with ``tf.lite.TFLiteConverter``; returns the
    quantization record for the manifest. Also used by the analyze stage (fp32)."""
    tf = import_tensorflow()
    if work_dir is None:
        raise ValueError("tf_convert needs a work_dir")  # a bug, not a user error
    conv, as_feed = tf_converter(tf, model, Path(work_dir))
    tool = f"TensorFlow {tf.__version__} TFLiteConverter"
    info: dict[str, Any]
    if precision == "fp32":
        info = {"tool": tool, "weights": "fp32", "activations": "fp32", "io": "float32"}
    elif precision == "fp16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
        info = {"tool": tool + " (supported_types float16)", "weights": "fp16 (DEQUANTIZE to fp32)",
                "activations": "fp32", "io": "float32"}
    elif precision == "int8-dynamic":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        info = {"tool": tool + " (Optimize.DEFAULT, no representative data)",
                "weights": "int8 per-channel (TensorFlow keeps weight tensors under 1024 elements float)",
                "activations": "int8 quantized at run time (dynamic range)", "io": "float32"}
    elif precision == "int8":
        if calib is None:  # the pipeline refuses int8 without --calib
            raise InputSpecError("int8 needs calibration data: give --calib FILE.npz")
        feeds = list(calib.batches(model))
        if not feeds:
            raise InputSpecError(f"--calib {calib.source}: no batch of {model.batch} samples in it")

        def representative():
            for feed in feeds:
                yield as_feed(feed)

        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.representative_dataset = representative
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if allow_float_fallback:
            ops.append(tf.lite.OpsSet.TFLITE_BUILTINS)  # ops without an int8 kernel stay float (audited)
        conv.target_spec.supported_ops = ops
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
        info = {"tool": tool + " (representative_dataset, TFLITE_BUILTINS_INT8)",
                "weights": "int8 symmetric per-channel", "activations": "int8 per-tensor affine (min/max on --calib)",
                "io": "int8", "calibration_batches": len(feeds), "calibration_source": calib.source}
        log(f"TFLiteConverter calibrates on {len(feeds)} batches")
    else:
        raise ConversionError(f"precision {precision!r} is not offered for Keras / SavedModel input")
    captured = io.StringIO()
    try:
        with quiet_python(), capture_fd2(captured):
            data = conv.convert()
    except Exception as exc:  # the converter raises ConverterError, RuntimeError, ValueError ...
        raise ConversionError(explain_tf_failure(exc, model.source, precision, allow_float_fallback,
                                                  captured.getvalue())) from None
    Path(dest).write_bytes(data)
    order_io(Path(dest), [tf_arg_name(s.name, i) for i, s in enumerate(model.inputs)], len(model.outputs))
    if precision == "int8-dynamic":
        kept = float_weights(Path(dest))
        info["float_weights"] = kept  # weight tensors TensorFlow left float (too small to quantize)
        if kept:
            log(f"int8-dynamic: {len(kept)} weight tensor(s) under 1024 elements stay float32")
    info["extra"] = TF_EXTRA
    return info


def float_weights(path: Path) -> list[str]:
    """Names of the float32 weight tensors (input 1 of conv / fully-connected ops) in a .tflite."""
    g = TFLiteGraph(path)
    return [g.tensor_name(ins[1]) for name, ins, _ in g.operators()
            if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV") and len(ins) > 1
            and g.type_name(ins[1]) == "FLOAT32" and g.is_const(ins[1])]


def tf_arg_name(name: str, i: int) -> str:
    """A model input's name as a TensorFlow argument / signature key (TFLite orders signature inputs by it)."""
    clean = re.sub(r"[^A-Za-z0-9_.\-/]", "_", name)
    return clean if clean and clean[0].isalnum() else f"input_{i}"


def tf_converter(tf: Any, model: Any, work_dir: Path):
    """(TFLiteConverter, feed -> representative sample) for the model at its fixed input shapes.

    Keras: ``keras.export.ExportArchive`` (tf-keras's for a Keras 2 file) writes a SavedModel with one endpoint at the fixed
    shapes (converting the Keras model's traced function directly leaves its variables as
    READ_VARIABLE ops instead of constants). SavedModel: its ``serving_default`` signature traced
    at the fixed shapes (``Model.tf_function``), the loaded object as the trackable.
    """
    names = [s.name for s in model.inputs]
    if model.kind == "keras":
        km = model.tf_model
        # a Keras 2 file is read by tf-keras (edgekit.keras2): its model is written out by tf-keras's ExportArchive
        keras2 = type(km).__module__.split(".")[0] == "tf_keras"
        keras = require("tf_keras", "keras") if keras2 else require("keras", "keras")
        export = work_dir / "keras_export"
        if not (export / "saved_model.pb").is_file():
            sig = [tf.TensorSpec(s.shape, s.dtype, name=tf_arg_name(s.name, i)) for i, s in enumerate(model.inputs)]
            archive = keras.export.ExportArchive()
            archive.track(km)

            def serve(*xs):
                return tuple(tf.nest.flatten(km(list(xs) if len(xs) > 1 else xs[0], training=False)))

            archive.add_endpoint("serve", serve, input_signature=sig)
            with quiet_python():
                if keras2:  # tf-keras's write_out prints the endpoints and takes no verbose
                    with contextlib.redirect_stdout(io.StringIO()):
                        archive.write_out(str(export))
                else:
                    archive.write_out(str(export), verbose=False)
        conv = tf.lite.TFLiteConverter.from_saved_model(str(export), signature_keys=["serve"])
    else:
        conv = tf.lite.TFLiteConverter.from_concrete_functions([model.tf_function], model.tf_model)
    # samples keyed by signature input name: TFLite orders a signature's inputs by name, not as the model does
    keys = [tf_arg_name(n, i) for i, n in enumerate(names)]
    return conv, lambda feed: {k: feed[n] for k, n in zip(keys, names, strict=True)}


def order_io(path: Path, input_names: list[str], n_outputs: int) -> None:
    """Make the .tflite's input/output order that of the model (TFLite orders a signature's tensors
    by name): inputs by the signature's input names, outputs output_0, output_1, ... Rewrites
    ``path`` only when the order differs (multi-input / multi-output models)."""
    if len(input_names) < 2 and n_outputs < 2:
        return
    g = TFLiteGraph(path)
    sg = g.sg
    sig = (g.model.signatureDefs or [None])[0]
    if sig is None:
        return

    def by_name(tms) -> dict[str, int]:
        return {text(t.name): int(t.tensorIndex) for t in tms or []}

    ins, outs = by_name(sig.inputs), by_name(sig.outputs)
    want_in = [ins[n] for n in input_names if n in ins]
    out_keys = sorted(outs, key=lambda k: (len(k), k))  # output_0, output_1, ..., output_10
    want_out = [outs[k] for k in out_keys]
    changed = False
    if len(want_in) == len(sg.inputs) and want_in != [int(i) for i in sg.inputs]:
        sg.inputs, changed = want_in, True
    if len(want_out) == len(sg.outputs) and want_out != [int(i) for i in sg.outputs]:
        sg.outputs, changed = want_out, True
    if changed:
        g.save(path)


def explain_tf_failure(exc: Exception, source: str, precision: str, allow_fallback: bool, log: str = "") -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in (text + "\n" + log).splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
    msg = f"{source}: TensorFlow's TFLiteConverter could not convert the model at {precision} ({type(exc).__name__}: {first[:300]})"
    if precision == "int8" and not allow_fallback:
        msg += ("; an op without an int8 kernel blocks full-integer int8: replace that layer, "
                "or pass --option allow_float_fallback=true to keep it float")
    return msg
