"""The .tflite builds that are not 16x8: the fp32 model (litert-torch from the torch.export program, or
TensorFlow's TFLiteConverter for Keras / SavedModel), fp16 weights (ai-edge-quantizer FLOAT_CASTING), and
int8 / int8-dynamic through PT2E (:mod:`edgekit.converters.common.pt2e` with android's quantizer), lowered by
litert-torch."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgekit.converters import ConvertJob, load_firmware
from edgekit.converters.common.pt2e import (
    calibrated,
    choose_observer,
    explain_export_failure,
    exported_module,
    torch_module,
    torch_run,
    torch_sample,
)
from edgekit.converters.tflite.detection import float_detection_outputs
from edgekit.converters.tflite.options import EXTRA, fused_hard, lstm_float
from edgekit.converters.tflite.quantizer import pt2e_quantizer

from edgekit.deps import require
from edgekit.errors import ConversionError
from edgekit.mixed.search import output_snr_db
from edgekit.quiet import quiet_python
from edgekit.tf_graph import tf_convert


def litert_torch():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return require("litert_torch", EXTRA)


def float_tflite(job: ConvertJob, dest: Path, layout: str) -> dict[str, Any]:
    """The fp32 .tflite at ``dest``: litert-torch from the float program, or TensorFlow's TFLiteConverter for
    Keras / SavedModel (the analyze stage's conversion copied where it made one; then the record carries
    ``conversion_s``, that conversion's time). Returns the quantization record."""
    m = job.model
    if m.is_tf:
        reuse = Path(job.float_tflite) if job.float_tflite is not None else None
        record = reuse.with_name(reuse.name + ".json") if reuse is not None else None
        if reuse is not None and reuse.is_file() and record.is_file():
            dest.write_bytes(reuse.read_bytes())  # the analyze stage's fp32 conversion, not done twice
            return {**json.loads(record.read_text()), "reused": "converted by the analyze stage"}
        return tf_convert(m, dest, "fp32", None, job.work_dir, log=job.log)
    sample = torch_sample(m)
    edge = lower(litert_torch(), torch_module(job), sample, layout, None, m)
    with quiet_python():
        edge.export(str(dest))
    return {"tool": "litert-torch", "weights": "fp32", "activations": "fp32", "io": "float32"}


def float_reference(job: ConvertJob, layout: str) -> Path:
    """The fp32 .tflite of this job's model in the work folder, made once per job: an int8 build makes it before
    calibrating (a model litert-torch cannot lower is refused before any calibration is spent on it) and the speed
    stage times the int8 build against it; fp16 and 16x8 start from it."""
    dest = job.work_dir / f"float-{layout}.tflite"
    if not dest.is_file():
        with job.substep("fp32 lowering"):
            float_tflite(job, dest, layout)
    return dest


def convert_torch(job: ConvertJob, dest: Path, layout: str) -> dict[str, Any]:
    """litert-torch: fp16 from the float program, int8 / int8-dynamic through PT2E (fp32: :func:`float_tflite`)."""
    m = job.model
    lt = litert_torch()
    if job.precision == "fp16":
        return fp16(float_reference(job, layout), dest)
    sample = torch_sample(m)
    module = torch_module(job)
    info, edge = pt2e_build(job, lt, module, sample, layout, dynamic=job.precision != "int8")
    with quiet_python():
        edge.export(str(dest))
    if info.get("detection_head_float"):
        heads = [i for i, s in enumerate(m.outputs) if job.output_kinds.get(s.name, "").startswith("detection")]
        made = float_detection_outputs(dest, heads)
        info["detection_head_float"] = made
        if made:
            info["io"] = "int8 input; the detection output float32 (its head's concatenation in float)"
    if job.precision == "int8" and info.get("calibration_measured_snr_db"):
        info["simulated_vs_real"] = simulated_vs_real(job, dest, layout, info)
    return info


def simulated_vs_real(job: ConvertJob, dest: Path, layout: str, info: dict[str, Any]) -> dict[str, Any] | None:
    """The output SNR of the fake-quant torch program litert-torch lowered (the chosen observer, calibrated on
    every sample) against the built .tflite's, on the observer choice's samples and float outputs: how far the
    simulation is from the real build (LiteRT's kernels, its rounding). ``observer_choice_snr_db`` is what the
    observer choice measured of that observer (the same program and samples, unless a build that did not lower
    moved the build to the next observer, or ``--option calibration`` chose it)."""
    known = job.cache.get("observer_ref")
    program = job.cache.get("lowered_program")
    if not known or program is None:
        return None
    from edgekit.verify import run_all

    feeds, ref = known
    model = load_firmware("tflite").LiteRTModel(str(dest), int(job.options.get("threads") or 2), layout == "nhwc",
                                                "ai_edge_litert")
    names = [s.name for s in job.model.inputs]
    real = round(output_snr_db(ref, run_all(lambda f: model([f[n] for n in names]), feeds)), 2)
    sim = round(output_snr_db(ref, torch_run(program, feeds, job.model)), 2)
    return {"samples": sum(len(next(iter(f.values()))) for f in feeds), "simulated_snr_db": sim,
            "real_snr_db": real, "gap_db": round(sim - real, 2),
            "observer_choice_snr_db": info["calibration_measured_snr_db"][info["calibration_method"]]}


def lower(lt, module, sample, layout, quant_config, m):
    """litert-torch's conversion of ``module`` (NHWC at the edges where ``layout`` says so); a torch.export or
    lowering failure is a ConversionError that says what it means."""
    if layout == "nhwc":
        idx_in = [i for i, s in enumerate(m.inputs) if len(s.shape) == 4]
        idx_out = [i for i, s in enumerate(m.outputs) if len(s.shape) == 4]
        module = lt.to_channel_last_io(module, args=idx_in, outputs=idx_out)
        sample = tuple(x.permute(0, 2, 3, 1).contiguous() if x.dim() == 4 else x for x in sample)
    try:
        with quiet_python():
            return lt.convert(module, sample, quant_config=quant_config)
    except Exception as exc:  # torch.export / lowering raise many types
        raise ConversionError(explain_export_failure(exc, m.source)) from None


def fp16(src: Path, dest: Path) -> dict[str, Any]:
    """The fp32 .tflite ``src`` with fp16 conv / linear weights (explicit DEQUANTIZE) at ``dest``."""
    aq = require("ai_edge_quantizer.quantizer", EXTRA)
    qt = require("ai_edge_quantizer.qtyping", EXTRA)
    q = aq.Quantizer(str(src))
    cast = []
    for op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "CONV_2D_TRANSPOSE", "EMBEDDING_LOOKUP"):
        try:
            q.update_quantization_recipe(
                regex=".*", algorithm_key=aq.AlgorithmName.FLOAT_CASTING,
                operation_name=getattr(qt.TFLOperationName, op),
                op_config=qt.OpQuantizationConfig(
                    weight_tensor_config=qt.TensorQuantizationConfig(num_bits=16, dtype=qt.TensorDataType.FLOAT),
                    compute_precision=qt.ComputePrecision.FLOAT, explicit_dequantize=True,
                ),
            )
            cast.append(op)
        except (ValueError, AttributeError):  # op not offered by this ai-edge-quantizer's FLOAT_CASTING
            continue
    with quiet_python():
        res = q.quantize(enable_progress_report=False)
    dest.write_bytes(bytes(res.quantized_model))
    return {"tool": "ai-edge-quantizer FLOAT_CASTING", "weights": "fp16 weights of " + ", ".join(cast),
            "activations": "fp32", "io": "float32"}


def pt2e_build(job: ConvertJob, lt, module, sample, layout: str, dynamic: bool):
    """The PT2E int8 (static, calibrated) or int8-dynamic build of ``module``, lowered by litert-torch:
    (the quantization record, litert-torch's edge model)."""
    qc = require("litert_torch.quantize.quant_config", EXTRA)
    m = job.model
    found: dict[str, int] = {}
    module = exported_module(job, module, sample, unroll_lstm=not dynamic and not lstm_float(job), found=found)
    head = () if dynamic else detection_head_nodes(job, module)
    keep = tuple(job.options.get("keep_float_nodes") or ()) + head
    chosen, measured = ("histogram", {}) if dynamic else choose_observer(
        job, module, sample, lambda obs: pt2e_quantizer(False, obs, keep, fused_hard(job)))
    refused = None  # the measured best observer's build that litert-torch could not lower, and why
    for obs in [chosen] + [o for o in sorted(measured, key=lambda k: -measured[k]) if o != chosen]:
        with job.substep("calibration"):
            converted, q, n_batches = calibrated(job, module, sample, obs,
                                                 lambda o: pt2e_quantizer(dynamic, o, keep, fused_hard(job)), dynamic=dynamic)
        with job.substep("TFLite lowering"):
            try:
                edge = lower(lt, converted, sample, layout, qc.QuantConfig(pt2e_quantizer=q), m)
            except ConversionError as exc:
                # litert-torch fails to lower some programs by their ranges alone (MTCNN's R-Net with min-max:
                # "MLIRError: Unable to parse type"): the next observer measured, where one was
                if obs == chosen and len(measured) > 1:
                    refused = (obs, str(exc).split(": ", 1)[-1][:200])
                    job.log(f"the {obs} observer's build did not lower ({refused[1]}); building with the next one "
                            "measured")
                    continue
                raise
        chosen = obs
        job.cache["lowered_program"] = converted  # the fake-quant program lowered: simulated_vs_real runs it
        break
    info: dict[str, Any] = {
        "tool": "litert-torch PT2E " + ("dynamic" if dynamic else "static"),
        "weights": "int8 symmetric per-channel",
        "activations": ("int8 quantized at run time (dynamic range)" if dynamic
                        else "int8 per-tensor affine ("
                        + ("HistogramObserver" if chosen == "histogram" else "MinMaxObserver") + ")"),
        "io": "float32" if dynamic else "int8",
    }
    if not dynamic:
        info.update({"calibration_method": chosen,
                     "calibration_chosen": ("by --option" if not measured else
                                            "by measurement (output SNR dB against float)" if refused is None else
                                            f"by measurement; the {refused[0]} observer's build, measured best, did "
                                            f"not lower ({refused[1]})"),
                     "calibration_measured_snr_db": measured or None,
                     "calibration_not_lowered": [refused[0]] if refused else [],
                     "calibration_batches": n_batches, "calibration_source": job.calib.source,
                     "add_mul_quantized": q.binary_nodes, "add_mul_annotated_by_edgekit": q.fixed_adds,
                     "int8_ops_annotated": q.int8_ops, "int8_ops_rewritten": q.rewritten,
                     "nodes_kept_float": [k for k in keep if k not in head]})
        if head:
            info["detection_head_float"] = list(head)
            job.log("the detection head's final concat stays float: its boxes and class scores keep int8 scales "
                    "of their own (one int8 scale for both puts scores in [0, 1] on the boxes' pixel steps)")
        if found.get("lstms") and lstm_float(job):
            info["lstm"] = f"float ({found['lstms']} LSTM(s) in float between DEQUANTIZE and QUANTIZE)"
        elif found.get("lstms"):
            info["lstm"] = f"int8 ({found['lstms']} LSTM(s) written out per time step)"
        job.log(f"PT2E calibrated on {n_batches} batches; {q.binary_nodes} add/mul node(s) quantized "
                f"({q.fixed_adds} annotated by edgekit where litert-torch's annotator missed them); edgekit "
                f"annotated {q.int8_ops} other int8 op(s), rewrote {q.rewritten} into int8 ops (BatchNorm after "
                "ReLU, PReLU, x**2, division by a sqrt or a constant)")
    return info, edge


def detection_head_nodes(job: ConvertJob, module) -> tuple[str, ...]:
    """The fx ``cat`` nodes that assemble a detection output (``detection`` / ``detection_cf`` kinds, judged by
    their detections), found from the output back through reshapes and permutes: left float, so that the boxes
    (pixels) and the scores ([0, 1]) each keep an int8 scale of their own up to the concat. Full-integer int8
    gives a concat one scale: a YOLOv8 head's boxes of 0..32 px put its scores on steps of 0.12, and the
    detections moved (IoU 0.66 against float); a YOLOv5 head concatenates xy, wh and the scores per level."""
    torch = require("torch")
    kinds = job.output_kinds
    names = [s.name for s in job.model.outputs]
    if not any(kinds.get(n, "").startswith("detection") for n in names):
        return ()
    out = next((n for n in module.graph.nodes if n.op == "output"), None)
    if out is None:
        return ()
    a = torch.ops.aten
    cat = {a.cat.default, a.concat.default}
    passing = {a.view.default, a.reshape.default, a.permute.default, a.transpose.int, a.flatten.using_ints,
               a.squeeze.dim, a.unsqueeze.default, a.clone.default, a._unsafe_view.default, a.contiguous.default}
    results = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    todo = [node for name, node in zip(names, results)
            if kinds.get(name, "").startswith("detection") and isinstance(node, torch.fx.Node)]
    found: list[str] = []
    seen = set()
    while todo:
        node = todo.pop()
        if node in seen or node.op != "call_function" or node.target not in cat | passing:
            continue
        seen.add(node)
        if node.target in cat:
            found.append(node.name)
            todo.extend(x for x in node.args[0] if isinstance(x, torch.fx.Node))
        else:
            todo.extend(x for x in node.args[:1] if isinstance(x, torch.fx.Node))
    return tuple(found)
