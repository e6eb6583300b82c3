"""Android / Linux-ARM: a ``.tflite`` model written by litert-torch (torch input) or by
TensorFlow's TFLiteConverter (Keras / SavedModel input), verified in LiteRT.

torch input (.pt2, TorchScript, factory):

fp32           litert-torch straight from the torch.export program (no TensorFlow).
fp16           fp32 model with fp16 conv/linear weights (ai-edge-quantizer FLOAT_CASTING,
               explicit DEQUANTIZE): half the weight bytes, float compute, float I/O.
int8-dynamic   PT2E dynamic config: int8 per-channel weights, activations quantized at run
               time inside the kernels (no calibration), float I/O.
int8           full integer: PT2E static config (per-channel symmetric int8 weights,
               per-tensor affine int8 activations, HistogramObserver ranges calibrated on
               --calib), int8 input and output tensors. litert-torch's add/mul annotators miss
               nodes of a program loaded from .pt2 (no source_fn_stack), and residual ADDs
               (MobileNetV2 blocks) then stay float between DEQUANTIZE and QUANTIZE; edgekit
               annotates every binary ``aten.add``/``aten.mul`` itself, and audits every
               op's tensor types after converting: a float op fails the build with the op
               list unless ``allow_float_fallback`` is set.

Keras (.keras / .h5) and SavedModel input (TensorFlow only needed here, ``edgekit[keras]``):
  Keras models are exported with ``keras.export.ExportArchive`` at the fixed input shapes, a
  SavedModel's ``serving_default`` is traced at them; ``tf.lite.TFLiteConverter`` then writes
fp32           the float model (BatchNorm folded, activations fused), NHWC as the model.
fp16           ``supported_types=[tf.float16]``: fp16 weights, DEQUANTIZE to fp32 compute.
int8-dynamic   ``Optimize.DEFAULT`` without data: int8 weights (tensors of >= 1024 elements;
               TensorFlow keeps smaller ones float), activations quantized at run time.
int8           full integer: ``representative_dataset`` from --calib, ``TFLITE_BUILTINS_INT8``,
               int8 input/output; the same audit, TRANSPOSE count and ``io=float`` rewrite.

Options (``--option key=value``):
  ``io=float``                  int8 with float32 input/output tensors (QUANTIZE/DEQUANTIZE at the
                                edges; the int8 scale/zero point stay in the manifest)
  ``layout=nhwc``               NHWC input/output, no TRANSPOSE at the edges (the host verifier
                                transposes the NCHW golden data)
  ``allow_float_fallback=true`` accept ops that stay float in an int8 build (warns)
  ``activations=int16``         int8 with 16-bit activations (TFLite's "16x8" mode: int8 per-channel
                                weights, int16 symmetric activations and I/O), written by
                                ai-edge-quantizer from the fp32 .tflite with min/max ranges over every
                                --calib batch. Far closer to float than int8 activations, and slower:
                                XNNPACK has no int16 kernels, LiteRT runs its reference ones. Mixed
                                precision tries it last where an int8 build fails verification.
  ``keep_float_tensors=a,b``    with activations=int16: ops kept float in the 16x8 model, named by their
                                output tensor in the fp32 .tflite (what the 16x8 layer search keeps)
  ``threads=N`` (host interpreter threads for verification, default 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from edgekit.converters import Artifact, ConvertJob, Runner, flag_option, load_firmware
from edgekit.converters.common.fxrecord import record_quantized
from edgekit.converters.common.pt2e import (
    SEARCH_CALIB,
    calibrated,
    choose_observer,
    explain_export_failure,
    exported_module,
    observer_outputs,
    torch_module,
    torch_run,
    weight_scale_floor_off,
)

from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError, InputSpecError
from edgekit.mixed.search import A16_SEARCH_RUN_S, Layer, Search, keep_layers, output_snr_db, search_feeds
from edgekit.mixed.search import db as mixed_db
from edgekit.quiet import quiet_python
from edgekit.tf_graph import tf_convert
from edgekit.tflite_graph import TFLiteGraph, text

PRIMARY = "model.tflite"
EXTRA = "android"
# 16x8: ops a LiteRT int16 kernel refuses to prepare are kept float one at a time, at most this many
A16_KERNEL_RETRIES = 8

# TFLite builtins with int8 kernels that XNNPACK (CPU), the GPU delegate (via dequant) and
# NNAPI take (TFLite op versions docs, xnnpack/README.md "Quantized operators").
INT8_DELEGATE_OPS = {
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D", "DEPTH_TO_SPACE",
    "FULLY_CONNECTED", "HARD_SWISH", "LEAKY_RELU", "LOGISTIC", "MAX_POOL_2D", "MAXIMUM", "MEAN",
    "MINIMUM", "MUL", "PAD", "PADV2", "RELU", "RELU6", "RELU_N1_TO_1", "RESHAPE", "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR", "SLICE", "SOFTMAX", "SPACE_TO_DEPTH", "SPLIT", "SQUEEZE",
    "STRIDED_SLICE", "SUB", "TANH", "TRANSPOSE", "TRANSPOSE_CONV", "ELU", "PRELU", "BATCH_MATMUL",
}
_FLOAT_TYPES = {"FLOAT32", "FLOAT16", "FLOAT64"}


def wide_activations(job: ConvertJob) -> bool:
    """``--option activations=int16`` (TFLite's 16x8 mode); any other value than int8 / int16 is refused."""
    a = str(job.options.get("activations") or "int8").lower()
    if a not in ("int8", "int16"):
        raise ConversionError(f"--option activations={a}: choose int8 (default) or int16 (16-bit activations, int8 "
                              "weights: TFLite's 16x8 mode)")
    return a == "int16"


def _litert_torch():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return require("litert_torch", EXTRA)


# ---------------------------------------------------------------- PT2E quantizer


def _quantizer(dynamic: bool, observer: str = "histogram", keep: tuple[str, ...] = ()):
    """litert-torch's PT2EQuantizer, with every binary ``aten.add``/``aten.mul`` annotated, activations
    observed by ``observer`` (histogram: HistogramObserver's L2-optimal range; minmax: the observed range),
    and the fx nodes named in ``keep`` left float (mixed precision)."""
    torch = require("torch")
    pq = require("litert_torch.quantize.pt2e_quantizer", EXTRA)
    from litert_torch.quantize.pt2e_quantizer_utils import (
        get_input_act_qspec,
        get_output_act_qspec,
        propagate_annotation,
    )
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, SharedQuantizationSpec

    from edgekit.converters import tflite_int8

    class EdgekitPT2EQuantizer(pq.PT2EQuantizer):
        fixed_adds = 0  # binary add/mul nodes annotated here (litert-torch's annotators missed them)
        binary_nodes = 0  # every binary add/mul on two tensors: all of them end up annotated
        int8_ops = rewritten = 0  # ops annotated / rewritten by converters/tflite_int8.py

        def transform_for_annotation(self, model):
            model = super().transform_for_annotation(model)
            if not dynamic:
                self.rewritten += tflite_int8.transform(model)
            return model

        def annotate(self, model):
            binary = (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor, torch.ops.aten.mul.Tensor,
                      torch.ops.aten.mul_.Tensor)
            if dynamic:
                return super().annotate(model)
            for n in model.graph.nodes:  # kept float: marked annotated with no quantization spec
                if n.name in keep:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
            model = self._annotate_for_static_quantization_config(model)
            cfg = self.global_config
            # The stock "add"/"mul" annotators find their nodes through source partitions
            # (node.meta["source_fn_stack"]), which a program loaded from a .pt2 does not carry:
            # those nodes are left unannotated, and where an ADD feeds another ADD (MobileNetV2
            # residuals) the result is DEQUANTIZE -> float ADD -> QUANTIZE in the .tflite.
            # Annotate every binary add/mul on tensors here.
            for n in model.graph.nodes:
                if n.op != "call_function" or n.target not in binary or not all(
                        isinstance(a, torch.fx.Node) for a in n.args[:2]):
                    continue
                self.binary_nodes += 1
                if "quantization_annotation" not in n.meta:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={a: get_input_act_qspec(cfg) for a in n.args[:2]},
                        output_qspec=get_output_act_qspec(cfg), _annotated=True,
                    )
                    self.fixed_adds += 1
            self.int8_ops += tflite_int8.annotate(model, cfg)
            if keep:  # a spec shared with a kept node's edge cannot be: those nodes stay float too
                for n in model.graph.nodes:  # again: tflite_int8 quantizes the output of a fused op's other readers
                    if n.name in keep:
                        n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
                changed = True
                while changed:
                    changed = False
                    float_nodes = {n for n in model.graph.nodes if n.name in keep or _blank(n)}
                    for n in model.graph.nodes:
                        a = n.meta.get("quantization_annotation")
                        if a is None or n in float_nodes:
                            continue
                        specs = [*a.input_qspec_map.values(), a.output_qspec]
                        if any(isinstance(q, SharedQuantizationSpec) and any(
                                x in float_nodes for x in (q.edge_or_node if isinstance(q.edge_or_node, tuple)
                                                           else (q.edge_or_node,))) for q in specs):
                            n.meta["quantization_annotation"] = QuantizationAnnotation(_annotated=True)
                            changed = True
            propagate_annotation(model)
            return model

    cfg = weight_scale_floor_off(pq.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic))
    if observer == "minmax" and not dynamic:
        import dataclasses

        act = cfg.input_activation
        act = dataclasses.replace(act, observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
        cfg = dataclasses.replace(cfg, input_activation=act, output_activation=act)
    return EdgekitPT2EQuantizer().set_global(cfg)


def _blank(n) -> bool:
    a = n.meta.get("quantization_annotation")
    return a is not None and not a.input_qspec_map and a.output_qspec is None and a._annotated


# ---------------------------------------------------------------- audit


def audit(path: Path, float_io_ok: bool = False) -> dict[str, Any]:
    """Every op of the .tflite with its tensor types; float ops, TRANSPOSEs and where they sit.
    With ``float_io_ok``, the QUANTIZE at an input and the DEQUANTIZE at an output are not float ops."""
    g = TFLiteGraph(path)
    graph_in, graph_out = set(g.sg.inputs), set(g.sg.outputs)
    ops, counts = [], {}
    for k, (name, ins, outs) in enumerate(g.operators()):
        act_ins = [i for i in ins if not g.is_const(i)]
        types = sorted({g.type_name(i) for i in act_ins + outs})
        counts[name] = counts.get(name, 0) + 1
        ops.append({"index": k, "op": name, "types": types, "node": g.tensor_name(outs[0]) if outs else "",
                    "at_input": any(i in graph_in for i in ins), "at_output": any(o in graph_out for o in outs)})
    float_ops = [o for o in ops if set(o["types"]) & _FLOAT_TYPES
                 and not (float_io_ok and ((o["op"] == "QUANTIZE" and o["at_input"])
                                           or (o["op"] == "DEQUANTIZE" and o["at_output"])))]
    transposes = [o for o in ops if o["op"] == "TRANSPOSE"]
    edge = [o for o in transposes if o["at_input"] or o["at_output"]]
    io_t = {"inputs": [_tensor_info(g, i) for i in g.sg.inputs], "outputs": [_tensor_info(g, i) for i in g.sg.outputs]}
    return {
        "ops": ops, "op_counts": counts, "float_ops": float_ops,
        "transpose": {"total": len(transposes), "at_edges": len(edge), "interior": len(transposes) - len(edge)},
        "not_delegable_int8": sorted({o["op"] for o in ops if o["op"] not in INT8_DELEGATE_OPS
                                      and o["op"] not in ("QUANTIZE", "DEQUANTIZE")}),
        "io": io_t,
    }


def _tensor_info(g: TFLiteGraph, i: int) -> dict[str, Any]:
    t = g.sg.tensors[i]
    q = t.quantization
    scale = [float(x) for x in q.scale] if q is not None and q.scale is not None else []
    zp = [int(x) for x in q.zeroPoint] if q is not None and q.zeroPoint is not None else []
    return {"name": g.tensor_name(i), "dtype": g.type_name(i).lower(), "shape": [int(d) for d in t.shape],
            "scale": scale[0] if len(scale) == 1 else (scale or None),
            "zero_point": zp[0] if len(zp) == 1 else (zp or None)}


def _float_counts(float_ops: list[dict[str, Any]]) -> str:
    """Float ops counted by op type, e.g. "HARD_SWISHx18, DEQUANTIZEx27"."""
    counts: dict[str, int] = {}
    for o in float_ops:
        counts[o["op"]] = counts.get(o["op"], 0) + 1
    return ", ".join(f"{k}x{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _short(node: str, width: int = 80) -> str:
    """A long TFLite node name cut at a path separator, not mid-word."""
    if len(node) <= width:
        return node
    tail = node[-width:]
    cut = min((i for i in (tail.find("/"), tail.find(";")) if i >= 0), default=-1)
    return "…" + (tail[cut + 1:] if cut >= 0 else tail)


def format_float_ops(float_ops: list[dict[str, Any]], limit: int = 12) -> str:
    shown = [f"{o['op']} ({'/'.join(o['types'])}, node {_short(o['node'])})" for o in float_ops[:limit]]
    more = f" and {len(float_ops) - limit} more" if len(float_ops) > limit else ""
    return "; ".join(shown) + more


def float_io(path: Path) -> int:
    """Give an int8 .tflite float32 input/output tensors: QUANTIZE after each int8 input and
    DEQUANTIZE before each int8 output, with the tensors' own scale and zero point (the
    "--io float" build). Returns the number of edges changed. Rewrites ``path``."""
    import copy

    g = TFLiteGraph(path)
    s, model, sg = g.schema, g.model, g.sg

    def opcode(code: int, version: int) -> int:
        for i, oc in enumerate(model.operatorCodes):
            if max(oc.builtinCode, oc.deprecatedBuiltinCode) == code:
                oc.version = max(oc.version, version)
                return i
        oc = s.OperatorCodeT()
        oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), version
        model.operatorCodes.append(oc)
        return len(model.operatorCodes) - 1

    def float_twin(i: int) -> int:
        t = copy.deepcopy(sg.tensors[i])
        t.type, t.quantization = s.TensorType.FLOAT32, None
        t.name = text(t.name) + "_float"
        buf = s.BufferT()
        model.buffers.append(buf)
        t.buffer = len(model.buffers) - 1
        sg.tensors.append(t)
        return len(sg.tensors) - 1

    remap: dict[int, int] = {}
    head, tail = [], []
    sg.inputs, sg.outputs = [int(i) for i in sg.inputs], [int(i) for i in sg.outputs]
    quantized = (s.TensorType.INT8, s.TensorType.INT16)
    for k, i in enumerate(list(sg.inputs)):
        if sg.tensors[i].type not in quantized:
            continue
        f = float_twin(i)
        op = s.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = opcode(s.BuiltinOperator.QUANTIZE, 1), [f], [i]
        head.append(op)
        sg.inputs[k] = remap[i] = f
    for k, i in enumerate(list(sg.outputs)):
        if sg.tensors[i].type not in quantized:
            continue
        f = float_twin(i)
        op = s.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = opcode(s.BuiltinOperator.DEQUANTIZE, 2), [i], [f]
        tail.append(op)
        sg.outputs[k] = remap[i] = f
    sg.operators = head + list(sg.operators) + tail
    for sig in model.signatureDefs or []:
        for tm in list(sig.inputs or []) + list(sig.outputs or []):
            tm.tensorIndex = remap.get(tm.tensorIndex, tm.tensorIndex)
    g.save(path)
    return len(remap)


# ---------------------------------------------------------------- converter


def _lstm_float(job: ConvertJob) -> bool:
    return str(job.options.get("lstm") or "int8").lower() == "float"


def _scope_regex(tensor: str) -> str:
    """ai-edge-quantizer's recipe regex for the op writing ``tensor``: it matches an op's scope, its output tensor
    names each followed by ";" (``tfl_flatbuffer_utils.get_op_scope``)."""
    return "(^|;)" + re.escape(tensor) + ";"


def _a16_recipe() -> Any:
    return require("ai_edge_quantizer.recipe", EXTRA).static_wi8_ai16()


@contextlib.contextmanager
def _aeq_errors(m: Any, verb: str) -> Iterator[None]:
    """ai-edge-quantizer raises many types on an op or graph it does not take: one ConversionError naming what it
    could not do (``verb``: calibrate, write) and the fix; edgekit's own errors pass through."""
    try:
        yield
    except (InputSpecError, ConversionError):
        raise
    except Exception as exc:
        raise ConversionError(f"{m.source}: ai-edge-quantizer could not {verb} the 16x8 model "
                              f"({type(exc).__name__}: {str(exc)[:300]}); use the int8 build (leave "
                              "--option activations out)") from None


@dataclass
class _A16:
    """What every 16x8 build of one model shares: the fp32 .tflite, its ai-edge-quantizer, the calibration ranges,
    and the ops LiteRT's int16 kernels refused (kept float in every later build)."""
    src: Path
    q: Any
    ranges: dict[str, Any]
    n_batches: int
    outputs: set[str]  # every op's output tensor name in the fp32 .tflite (what keep_float_tensors may name)
    refusals: list[tuple[str, Any]] = field(default_factory=list)  # (tensor regex, op) recipe entries, no_quantize
    float_for_kernels: list[str] = field(default_factory=list)


class TFLiteConverter:
    name = "tflite"

    def convert(self, job: ConvertJob) -> Artifact:
        m = job.model
        if not m.is_tf and (not m.is_torch or m.torch_module is None):
            raise ConversionError(
                f"{m.source}: the android target converts PyTorch (.pt2, TorchScript, pkg.module:factory) and "
                "Keras / SavedModel models; ONNX input is not taken: export the torch model with torch.export.save"
            )
        allow_fallback = flag_option(job.options, "allow_float_fallback")
        io_kind = str(job.options.get("io") or "int8").lower()
        if io_kind not in ("int8", "float"):
            raise ConversionError(f"--option io={io_kind}: choose int8 (default for int8) or float")
        if job.precision not in ("fp32", "fp16", "int8-dynamic", "int8"):
            raise ConversionError(
                f"precision {job.precision!r} is not offered by the android target (fp32, fp16, int8-dynamic, int8)"
            )
        dest = job.out_dir / PRIMARY
        notes: list[str] = []
        t0 = time.perf_counter()
        if m.is_tf:
            if job.options.get("layout"):
                raise ConversionError(
                    f"--option layout={job.options['layout']}: layout is for torch (NCHW) models; the .tflite of a "
                    "Keras / SavedModel model keeps the model's own layout (NHWC), no TRANSPOSE needed"
                )
            # "source": the .tflite takes the model's own tensors as they are (runners transpose nothing)
            layout = "source"
            meta: dict[str, Any] = {"layout": layout, "source_layout": m.inputs[0].layout or "as the model",
                                    "converter": "TensorFlow TFLiteConverter",
                                    "toolchain": toolchain_versions("tensorflow-cpu", "tensorflow", "keras")}
        else:
            layout = str(job.options.get("layout") or "nchw").lower()
            if layout not in ("nchw", "nhwc"):
                raise ConversionError(f"--option layout={layout}: choose nchw (as the torch model) or nhwc")
            meta = {"layout": layout, "converter": "litert-torch"}
        if job.options.get("keep_float_tensors") and not wide_activations(job):
            raise ConversionError("--option keep_float_tensors names ops of the 16x8 model: it goes with --option "
                                  "activations=int16 (an int8 build keeps torch.export nodes: keep_float_nodes)")
        if wide_activations(job):
            if job.precision != "int8":
                raise ConversionError(f"--option activations=int16 is for --precision int8 (int8 weights, int16 "
                                      f"activations); {job.precision} has no quantized activations")
            meta["converter"] += ", then ai-edge-quantizer"
            meta["quantization"] = self._a16(job, dest, layout)
        elif job.precision == "fp32":
            meta["quantization"] = self._float_tflite(job, dest, layout)
            t0 -= meta["quantization"].pop("conversion_s", 0.0)  # reused: that conversion's time
        elif m.is_tf:
            meta["quantization"] = tf_convert(m, dest, job.precision, job.calib, job.work_dir, allow_fallback,
                                              log=job.log)
        else:
            meta["quantization"] = self._convert_torch(job, dest, layout)
        if job.precision == "int8" and io_kind == "float":
            meta["int8_io"] = audit(dest)["io"]  # the scale/zero point inside the float edges (int16: 16x8)
            n = float_io(dest)
            meta["quantization"]["io"] = "float32 (QUANTIZE/DEQUANTIZE at the edges)"
            job.log(f"io=float: {n} int8 input/output tensor(s) given float32 twins")
        return self._finish(job, dest, meta, notes, t0, io_kind, allow_fallback)

    def _float_tflite(self, job: ConvertJob, dest: Path, layout: str) -> dict[str, Any]:
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
        torch = require("torch")
        sample = tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in m.example_feeds().values())
        edge = self._lower(_litert_torch(), torch_module(job), sample, layout, None, m)
        with quiet_python():
            edge.export(str(dest))
        return {"tool": "litert-torch", "weights": "fp32", "activations": "fp32", "io": "float32"}

    def _convert_torch(self, job: ConvertJob, dest: Path, layout: str) -> dict[str, Any]:
        """litert-torch: fp16 from the float program, int8 / int8-dynamic through PT2E (fp32: _float_tflite)."""
        m = job.model
        torch = require("torch")
        lt = _litert_torch()
        if job.precision == "fp16":
            self._float_tflite(job, job.work_dir / "float.tflite", layout)
            return self._fp16(job.work_dir / "float.tflite", dest)
        sample = tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in m.example_feeds().values())
        module = torch_module(job)
        info, edge = self._pt2e(job, lt, module, sample, layout, dynamic=job.precision != "int8")
        with quiet_python():
            edge.export(str(dest))
        return info

    def _a16(self, job: ConvertJob, dest: Path, layout: str) -> dict[str, Any]:
        """``activations=int16``: the fp32 .tflite (:meth:`_float_tflite`), then ai-edge-quantizer's
        ``static_wi8_ai16`` recipe: int8 per-channel weights, int16 symmetric per-tensor activations. Ranges are
        the min and max over every --calib batch: ai-edge-quantizer's own calibration keeps a moving average of
        each batch's min/max (smoothing 0.95), which ends inside the data's range (ppocr-cls: input range +-0.93
        for data reaching +-1.0, 25% of the pixels clipped, 22.9 dB output SNR against 29.5 dB with the true
        range). Ops named in ``keep_float_tensors`` stay float. Returns the quantization record."""
        a = self._a16_source(job, layout)
        kept = list(job.options.get("keep_float_tensors") or [])
        self._a16_write(job, a, dest, kept)
        job.log(f"16-bit activations: ai-edge-quantizer static_wi8_ai16, min/max ranges over {a.n_batches} batches"
                + (f"; {len(kept)} op(s) kept float" if kept else ""))
        info = {
            "tool": f"ai-edge-quantizer {_dist_version('ai-edge-quantizer')} static_wi8_ai16 (TFLite 16x8)",
            "weights": "int8 symmetric per-channel", "activations": "int16 symmetric per-tensor (min/max)",
            "io": "int16", "calibration_method": "minmax", "calibration_chosen": "min/max over every batch (16 bits "
            "leave room for the whole range)", "calibration_batches": a.n_batches,
            "calibration_source": job.calib.source, "activation_bits": 16,
        }
        if a.float_for_kernels:
            info["float_for_litert_int16_kernels"] = list(a.float_for_kernels)
        if kept:
            info["keep_float_tensors"] = kept
        return info

    def _a16_source(self, job: ConvertJob, layout: str) -> _A16:
        """The fp32 .tflite, its ai-edge-quantizer and the calibration ranges: made once per model and layout,
        reused by the 16x8 layer search's builds (each then only quantizes: about 3 s on ppocr-cls)."""
        if f"a16-{layout}" in job.cache:
            return job.cache[f"a16-{layout}"]
        m = job.model
        aq = require("ai_edge_quantizer.quantizer", EXTRA)
        src = job.work_dir / "float-for-16x8.tflite"
        self._float_tflite(job, src, layout)
        with _aeq_errors(m, "calibrate"):
            interp = _interpreter(src, 1)
            sig = next(iter(interp.get_signature_list()))
            by_index = {d["index"]: name for name, d in interp.get_signature_runner(sig).get_input_details().items()}
            sig_names = [by_index[d["index"]] for d in interp.get_input_details()]  # in the model's input order
            q = aq.Quantizer(str(src))
            q.load_quantization_recipe(_a16_recipe())
            ranges, n_batches = self._a16_ranges(job, q, sig, sig_names, layout)
        if n_batches == 0:
            raise InputSpecError(f"--calib {job.calib.source}: no batch of {m.inputs[0].shape[0]} samples in it")
        g = TFLiteGraph(src)
        outputs = {g.tensor_name(o[2][0]) for o in g.operators() if o[2]}
        a = _A16(src, q, ranges, n_batches, outputs)
        job.cache[f"a16-{layout}"] = a
        return a

    def _a16_write(self, job: ConvertJob, a: _A16, dest: Path, kept: list[str]) -> None:
        """The 16x8 model at ``dest`` with the ops whose output tensors are ``kept`` float. Ops LiteRT's int16
        kernels refuse to prepare are kept float too and it is quantized again (remembered for later builds)."""
        m = job.model
        qtyping = require("ai_edge_quantizer.qtyping", EXTRA)
        unknown = [t for t in kept if t not in a.outputs]
        if unknown:
            raise ConversionError(f"--option keep_float_tensors: no op of the fp32 .tflite writes "
                                  f"{', '.join(map(repr, unknown[:5]))}; name ops by their output tensor (the 16x8 "
                                  "build's report lists them)")
        with _aeq_errors(m, "write"):
            a.q.load_quantization_recipe(_a16_recipe())
            for regex, op in a.refusals:
                a.q.update_quantization_recipe(regex=regex, operation_name=op, algorithm_key="no_quantize")
            for t in kept:
                a.q.update_quantization_recipe(regex=_scope_regex(t), operation_name="*",
                                               algorithm_key="no_quantize")
            for _ in range(A16_KERNEL_RETRIES + 1):
                with job.substep("16x8 quantization"), quiet_python():
                    res = a.q.quantize(a.ranges)
                dest.write_bytes(bytes(res.quantized_model))
                refused = _refused_node(dest)
                if refused is None:
                    break
                # LiteRT's int16 kernels check more than ai-edge-quantizer does (oww-hey-mycroft: an ADD of two
                # int16 inputs whose scales its general path cannot rescale): that op stays float, quantize again
                op, tensor, why = refused
                if len(a.float_for_kernels) == A16_KERNEL_RETRIES:
                    raise ConversionError(f"{m.source}: the 16x8 model does not load in LiteRT: {op} ({why}), "
                                          f"after {A16_KERNEL_RETRIES} ops were kept float for the same reason")
                if any(f.startswith(op + " ") for f in a.float_for_kernels):  # again: every op of that kind float
                    a.float_for_kernels.append(f"{op} (every one: {why})")
                    job.log(f"16x8: LiteRT's int16 {op} kernel refuses a second node ({why}); every {op} kept float")
                    a.refusals.append((".*", qtyping.TFLOperationName(op)))
                else:
                    a.float_for_kernels.append(f"{op} ({_short(tensor, 60)}: {why})")
                    job.log(f"16x8: LiteRT's int16 {op} kernel refuses node {tensor!r} ({why}); kept float")
                    a.refusals.append((_scope_regex(tensor), "*"))
                a.q.update_quantization_recipe(regex=a.refusals[-1][0], operation_name=a.refusals[-1][1],
                                               algorithm_key="no_quantize")

    @staticmethod
    def _a16_ranges(job: ConvertJob, q: Any, key: str, sig_names: list[str], layout: str) -> tuple[dict, int]:
        """Each tensor's min and max over every --calib batch (one ai-edge-quantizer calibration per batch)."""
        m = job.model
        ranges: dict[str, Any] = {}
        n_batches = 0
        assert job.calib is not None  # the pipeline refuses int8 without --calib
        with job.substep("calibration (16-bit activations)"), quiet_python():
            for feed in job.calib.batches(m):
                sig_feed = {}
                for name, spec in zip(sig_names, m.inputs, strict=True):
                    x = np.ascontiguousarray(feed[spec.name], dtype=np.float32)
                    sig_feed[name] = x.transpose(0, 2, 3, 1) if layout == "nhwc" and x.ndim == 4 else x
                one = q.calibrate({key: [sig_feed]})
                n_batches += 1
                for t, v in one.items():
                    if t in ranges and "min" in v and "max" in v:
                        v = {**ranges[t], "min": np.minimum(ranges[t]["min"], v["min"]),
                             "max": np.maximum(ranges[t]["max"], v["max"])}
                    ranges[t] = v
        return ranges, n_batches

    def _finish(self, job: ConvertJob, dest: Path, meta: dict[str, Any], notes: list[str], t0: float,
                io_kind: str, allow_fallback: bool) -> Artifact:
        meta["conversion_s"] = round(time.perf_counter() - t0, 2)
        rep = audit(dest, float_io_ok=io_kind == "float")
        meta["io"] = rep["io"]
        meta["op_counts"] = rep["op_counts"]
        meta["transpose"] = rep["transpose"]
        meta["float_ops"] = [{k: o[k] for k in ("op", "types", "node")} for o in rep["float_ops"]]
        meta["not_delegable_int8"] = rep["not_delegable_int8"]
        job.log(f"{PRIMARY}: {sum(rep['op_counts'].values())} ops "
                + ", ".join(f"{k}x{n}" for k, n in sorted(rep["op_counts"].items()))
                + f"; TRANSPOSE {rep['transpose']['total']} ({rep['transpose']['at_edges']} at the edges)")
        full_int8 = job.precision == "int8"  # at fp32 / fp16 / int8-dynamic every op computes in float by request
        listed_float = (_float_counts(rep["float_ops"]) if full_int8 and wide_activations(job)
                        else format_float_ops(rep["float_ops"]))
        if full_int8 and meta["quantization"].get("float_for_litert_int16_kernels"):
            notes.append("kept float because LiteRT's int16 kernels refuse to prepare them: "
                         + "; ".join(meta["quantization"]["float_for_litert_int16_kernels"]))
        if full_int8 and wide_activations(job):
            notes.append("16-bit activations (TFLite 16x8): XNNPACK, the GPU delegate and NNAPI take no int16 "
                         "activations, so LiteRT runs its reference int16 kernels on the CPU (slower than int8; the "
                         "host latency below is that)")
        notes.append("op report after converting: " + ", ".join(f"{k}x{n}" for k, n in sorted(rep["op_counts"].items()))
                     + f"; TRANSPOSE {rep['transpose']['total']} ({rep['transpose']['at_edges']} at the edges)"
                     + ((f"; float ops: {listed_float}" if rep["float_ops"] else "; no float ops") if full_int8 else "")
                     + (f"; no int8 kernel in XNNPACK/NNAPI for: {', '.join(rep['not_delegable_int8'])}"
                        if rep["not_delegable_int8"] and full_int8 else ""))
        if rep["transpose"]["interior"]:
            job.warn(f"{rep['transpose']['interior']} TRANSPOSE op(s) inside the graph cost time at run time")
        refused = _builtin_refusal(dest)
        meta["builtin_kernels"] = refused or "load"
        if refused:  # host verification runs XNNPACK, which may take what TFLite's own kernels check and refuse
            job.warn(f"{PRIMARY} runs on XNNPACK (host verification) but TFLite's builtin kernels refuse it "
                     f"({refused}): it fails to load where an op falls back to them (GPU / NNAPI delegates, no "
                     "XNNPACK)")
            notes.append(f"TFLite's builtin kernels refuse this model: {refused}")
        if job.precision == "int8":
            meta["full_integer"] = not rep["float_ops"]
            if rep["float_ops"]:
                listed = format_float_ops(rep["float_ops"])
                if wide_activations(job):  # ai-edge-quantizer has no int16 version of some ops (HARD_SWISH)
                    kept = job.options.get("keep_float_tensors") or []
                    notes.append("ops float in the 16x8 build (DEQUANTIZE and QUANTIZE around them; "
                                 + (f"{len(kept)} kept by keep_float_tensors, the others " if kept else "")
                                 + f"ai-edge-quantizer maps no int16 kernel to them): {_float_counts(rep['float_ops'])}")
                elif job.options.get("keep_float_nodes") or _lstm_float(job):
                    why = " and ".join(w for w, on in (("keep_float_nodes (mixed precision)",
                                                         job.options.get("keep_float_nodes")),
                                                        ("--option lstm=float", _lstm_float(job))) if on)
                    notes.append(f"{len(rep['float_ops'])} op(s) float by {why}: {listed}")
                elif not allow_fallback:
                    raise ConversionError(
                        f"full-integer int8 was asked but {len(rep['float_ops'])} op(s) run in float: {listed}; "
                        "replace those layers, or pass --option allow_float_fallback=true to accept them"
                    )
                else:
                    job.warn(f"{len(rep['float_ops'])} op(s) stay float (allowed by allow_float_fallback): {listed}")
            else:
                q_in = (meta.get("int8_io") or rep["io"])["inputs"][0]
                notes.append("full integer: every op takes and gives "
                             + ("int16 activations (int8 weights)" if wide_activations(job) else "int8 tensors")
                             + (" behind float32 I/O" if io_kind == "float" else "")
                             + f" (input scale {q_in['scale']:.6g}, zero point {q_in['zero_point']})")
        threads = int(job.options.get("threads") or 2)
        meta["host_latency_ms"] = self._latency(dest, (1, 2))
        meta["verify_threads"] = threads
        notes.append("LiteRT interpreter on this host (XNNPACK), median latency: "
                     + ", ".join(f"{k} thread(s) {v:.3f} ms" for k, v in meta["host_latency_ms"].items()))
        return Artifact(
            format="tflite", precision=job.precision, primary=PRIMARY, files=[PRIMARY],
            runtime=f"ai-edge-litert {_dist_version('ai-edge-litert')} interpreter (XNNPACK, {threads} threads)",
            meta=meta, notes=notes,
        )

    # -- steps

    def _lower(self, lt, module, sample, layout, quant_config, m):
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

    def _fp16(self, src: Path, dest: Path) -> dict[str, Any]:
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

    def _pt2e(self, job: ConvertJob, lt, module, sample, layout: str, dynamic: bool):
        qc = require("litert_torch.quantize.quant_config", EXTRA)
        m = job.model
        found: dict[str, int] = {}
        module = exported_module(job, module, sample, unroll_lstm=not dynamic and not _lstm_float(job), found=found)
        keep = tuple(job.options.get("keep_float_nodes") or ())
        chosen, measured = ("histogram", {}) if dynamic else choose_observer(
            job, module, sample, lambda obs: _quantizer(False, obs, keep))
        with job.substep("calibration"):
            converted, q, n_batches = calibrated(job, module, sample, chosen,
                                                 lambda obs: _quantizer(dynamic, obs, keep), dynamic=dynamic)
        with job.substep("TFLite lowering"):
            edge = self._lower(lt, converted, sample, layout, qc.QuantConfig(pt2e_quantizer=q), m)
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
                         "calibration_chosen": ("by measurement (output SNR dB against float)" if measured
                                                else "by --option"),
                         "calibration_measured_snr_db": measured or None,
                         "calibration_batches": n_batches, "calibration_source": job.calib.source,
                         "add_mul_quantized": q.binary_nodes, "add_mul_annotated_by_edgekit": q.fixed_adds,
                         "int8_ops_annotated": q.int8_ops, "int8_ops_rewritten": q.rewritten,
                         "nodes_kept_float": list(keep)})
            if _lstm_float(job):
                info["lstm"] = "float (any LSTM runs in float between DEQUANTIZE and QUANTIZE)"
            elif found.get("lstms"):
                info["lstm"] = f"int8 ({found['lstms']} LSTM(s) written out per time step)"
            job.log(f"PT2E calibrated on {n_batches} batches; {q.binary_nodes} add/mul node(s) quantized "
                    f"({q.fixed_adds} annotated by edgekit where litert-torch's annotator missed them); edgekit "
                    f"annotated {q.int8_ops} other int8 op(s), rewrote {q.rewritten} into int8 ops (BatchNorm after "
                    "ReLU, PReLU, x**2, division by a sqrt or a constant)")
        return info, edge

    @staticmethod
    def mixed_unavailable(job: ConvertJob) -> str | None:
        if wide_activations(job):
            return ("--option activations=int16 was asked: every activation is already 16-bit, and the layer search "
                    "keeps layers of the int8 build; leave the option out to search them, or pass --tolerance to "
                    "accept this agreement")
        if job.model.is_tf:
            return ("Keras / SavedModel input is quantized whole by TensorFlow's TFLiteConverter, which keeps no "
                    "chosen layer float; the PT2E path does: pass --option keras=onnx (tf2onnx, then PT2E), or "
                    "--tolerance to accept this agreement")
        return None

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        """The fx nodes an int8 build may keep float (LiteRT runs them in float between DEQUANTIZE and
        QUANTIZE), ranked by local INT8 SQNR; the search runs the fake-quant program in torch."""
        torch = require("torch")
        m = job.model
        sample = tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in m.example_feeds().values())
        module = exported_module(job, torch_module(job), sample, unroll_lstm=not _lstm_float(job))
        method = artifact.meta["quantization"]["calibration_method"]
        base = tuple(job.options.get("keep_float_nodes") or ())
        search = search_feeds(job)
        stats: dict[str, Any] = {}  # observer -> its calibration with no layer kept, reused by every kept set
        conv, _, _ = calibrated(job, module, sample, method, lambda obs: _quantizer(False, obs, base),
                                limit=SEARCH_CALIB, stats=stats)
        layers = _local_sqnr(conv, search[:8], m)
        ref = torch_run(module, search, m)

        def build(kept: list[str], observer: str):
            return calibrated(job, module, sample, observer, lambda obs: _quantizer(False, obs, base + tuple(kept)),
                              limit=SEARCH_CALIB, stats=stats)[0]

        outputs, calibration_for = observer_outputs(build, job, method, ref, search)
        return Search(layers, outputs, ref, "float (between DEQUANTIZE and QUANTIZE; LiteRT runs it in fp32)",
                      calibration_for)

    def activations16(self, job: ConvertJob, artifact: Artifact) -> Artifact | None:
        """Mixed precision's last step where an int8 build (and its layer search) fails verification: the build
        again with every activation int16 (``--option activations=int16``); None where the user chose
        ``--option activations``."""
        if "activations" in job.options:
            return None
        saved = job.options
        job.options = {k: v for k, v in saved.items() if k not in ("keep_float_nodes", "calibration", "lstm",
                                                                     "bias_correction")}
        job.options["activations"] = "int16"
        try:
            return self.convert(job)
        finally:
            job.options = saved

    @staticmethod
    def _a16_options(job: ConvertJob, kept: list[str]) -> dict[str, Any]:
        """The options of a 16x8 build of ``job``: the int8 build's options without those of int8 activations."""
        opts = {k: v for k, v in job.options.items() if k not in ("keep_float_nodes", "calibration", "lstm",
                                                                   "bias_correction")}
        return {**opts, "activations": "int16", "keep_float_tensors": list(kept)}

    def a16_keep(self, job: ConvertJob, artifact: Artifact, kept: list[str], calibration: str | None = None
                 ) -> Artifact:
        """The 16x8 build again with the ops writing ``kept`` float (the 16x8 layer search's ``keep_layers``)."""
        saved = job.options
        job.options = self._a16_options(job, kept)
        try:
            return self.convert(job)
        finally:
            job.options = saved

    def a16_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        """The 16x8 layer search: every op with an int16 output may be kept float (ai-edge-quantizer's
        ``no_quantize``). Ranked by the worse of the relative noise each op adds (its output's error against the
        fp32 .tflite, every tensor kept, builtin kernels, less its inputs' error, on 8 search samples) and, for an
        op with int8 weights, the output SNR with only its weights rounded (:func:`_a16_weight_effect`). The search
        builds only quantize again (calibration ranges reused) and run in LiteRT; the reference is the fp32
        .tflite."""
        layout = artifact.meta.get("layout", "nchw")
        a = self._a16_source(job, layout)
        # LiteRT's reference int16 kernels are slow on large models (ppocr-rec: 0.48 s a line): fewer samples there
        lat = artifact.meta.get("host_latency_ms") or {}
        ms = lat.get(str(job.options.get("threads") or 2)) or lat.get("1") or 0.0
        feeds = search_feeds(job, int(min(32, max(8, A16_SEARCH_RUN_S * 1000 / max(ms, 1e-3)))))
        names = [s.name for s in job.model.inputs]
        nhwc = layout == "nhwc"
        fw = load_firmware("tflite")

        def run(path: Path, on: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
            from edgekit.verify import run_all

            model = fw.LiteRTModel(str(path), int(job.options.get("threads") or 2), nhwc, "ai_edge_litert")
            return run_all(lambda f: model([f[n] for n in names]), on)

        ref = run(a.src, feeds)
        built = job.work_dir / "search-16x8.tflite"
        base_kept = list(job.options.get("keep_float_tensors") or [])
        layers = _a16_local_noise(a.src, job.out_dir / artifact.primary, feeds[:8], names, nhwc, fw, base_kept)
        # an op's own noise says nothing of what the layers after it make of it: where its int8 weights alone cost
        # the output more, that ranks it (a 16x8 build's error is mostly its int8 weights')
        effect = _a16_weight_effect(a.src, job.out_dir / artifact.primary, lambda p: run(p, feeds), ref,
                                    job.work_dir / "search-16x8-weights.tflite")
        for lay in layers:
            if lay.name in effect:
                lay.local_sqnr_db = min(lay.local_sqnr_db, effect[lay.name])

        def outputs(kept: list[str]) -> list[np.ndarray]:
            self._a16_write(job, a, built, base_kept + kept)
            return run(built, feeds)

        return Search(layers, outputs, ref, "float in the 16x8 model (between DEQUANTIZE and QUANTIZE; LiteRT runs "
                      "it in fp32)")

    @staticmethod
    def float_group(job: ConvertJob, artifact: Artifact) -> tuple[dict[str, str], str] | None:
        """Mixed precision's first step where a full-integer build with LSTMs written out in int8 fails
        verification: the same build with every LSTM float (``--option lstm=float``, as the jetson and ios INT8
        builds run LSTMs), before any single layer is searched; None where the user chose ``--option lstm``."""
        lstm = str((artifact.meta.get("quantization") or {}).get("lstm", ""))
        if "lstm" in job.options or not lstm.startswith("int8"):
            return None
        return {"lstm": "float"}, "every LSTM float (between DEQUANTIZE and QUANTIZE, as jetson and ios run them)"

    keep_layers = keep_layers  # the int8 build again with the kept fx nodes float (edgekit.mixed)

    def _latency(self, path: Path, threads: tuple[int, ...], iters: int = 50) -> dict[str, float]:
        out = {}
        for t in threads:
            interp = _interpreter(path, t)
            for d in interp.get_input_details():
                interp.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
            for _ in range(5):
                interp.invoke()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                interp.invoke()
                times.append((time.perf_counter() - t0) * 1000)
            out[str(t)] = round(statistics.median(times), 4)
        return out

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        # the bundle's own runner class (firmware/tflite/run.py): int8 I/O quantized and
        # dequantized with the tensors' scale / zero point, NHWC transposed, as on the board
        require("ai_edge_litert.interpreter", EXTRA)
        model = load_firmware("tflite").LiteRTModel(str(job.out_dir / artifact.primary),
                                                   int(job.options.get("threads") or 2),
                                                   artifact.meta.get("layout") == "nhwc", "ai_edge_litert")
        names = [s.name for s in job.model.inputs]
        return lambda feeds: model([feeds[n] for n in names])

    @staticmethod
    def versions() -> dict[str, str]:
        # TensorFlow (Keras input only) is recorded in artifact.toolchain of the builds that used it
        return toolchain_versions("torch", "litert-torch", "litert-converter", "ai-edge-litert", "ai-edge-quantizer",
                                  "torchao")


def _local_sqnr(converted, feeds: list[dict[str, np.ndarray]], m) -> list[Layer]:
    """Each quantized compute node of the fake-quant program with the SQNR of its own output's INT8
    quantize/dequantize (the activation before and after, on the same run) and, for a conv / linear, of its int8
    weights at its output (the lower of the two)."""
    g = converted.graph
    compute = ("conv", "linear", "add", "mul", "cat", "matmul", "bmm", "mean", "pool", "hardtanh", "relu")
    seen, weights = record_quantized(converted, feeds, m, skip_dequantize=False)
    layers = []
    for n in g.nodes:
        if n.op != "call_function" or not any(c in str(n.target) for c in compute) or (
                n.name not in seen and n.name not in weights):  # a conv fused with its ReLU: weights only
            continue
        db = float("inf")
        if n.name in seen:
            x = np.concatenate([a.ravel() for a, _ in seen[n.name]]).astype(np.float64)
            d = np.concatenate([b.ravel() for _, b in seen[n.name]]).astype(np.float64)
            db = mixed_db(float(np.sum(x ** 2)), float(np.sum((x - d) ** 2)))
        if n.name in weights:
            db = min(db, mixed_db(*weights[n.name]))
        stack = n.meta.get("nn_module_stack") or {}
        where = next(reversed(stack.values()))[0] if stack else ""
        op = str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target)
        layers.append(Layer(n.name, f"{op}{' ' + where if where else ''}", round(db, 2)))
    return layers


# ops that compute (their rounding adds noise): the 16x8 layer search's candidates; data movement is left
_A16_MOVES = {"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "QUANTIZE", "DEQUANTIZE", "PAD", "PADV2", "SLICE",
              "STRIDED_SLICE", "SPLIT", "SPLIT_V", "GATHER", "CONCATENATION", "PACK", "UNPACK", "MAX_POOL_2D",
              "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "RESIZE_NEAREST_NEIGHBOR"}


def _a16_local_noise(src: Path, built: Path, feeds: list[dict[str, np.ndarray]], names: list[str], nhwc: bool,
                     fw: Any, kept: list[str]) -> list[Layer]:
    """The 16x8 build's ops with an int16 output, each with the noise it adds itself: every tensor of the fp32
    and the 16x8 model kept (builtin kernels, no XNNPACK, so none is fused away), then per op the relative error
    power of its output against the fp32 one, less the largest of its activation inputs'. ``local_sqnr_db`` is
    that added noise in dB below the signal (low: the op's own rounding costs most)."""
    litert = require("ai_edge_litert.interpreter", EXTRA)

    def interp(path: Path):
        it = litert.Interpreter(model_path=str(path), experimental_preserve_all_tensors=True,
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        it.allocate_tensors()
        return it

    f_it, q_it = interp(src), interp(built)
    f_idx = {d["name"]: d["index"] for d in f_it.get_tensor_details()}
    q_det = {d["name"]: d for d in q_it.get_tensor_details()}
    g = TFLiteGraph(built)
    cands: list[tuple[str, str, list[str]]] = []  # (op, output tensor, activation inputs)
    for op, ins, outs in g.operators():
        if not outs or op in _A16_MOVES or g.type_name(outs[0]) != "INT16":
            continue
        out = g.tensor_name(outs[0])
        if out in f_idx and out not in kept:
            cands.append((op, out, [g.tensor_name(i) for i in ins if i >= 0 and not g.is_const(i)]))
    watched = {t for _, out, ins in cands for t in [out, *ins] if t in f_idx and t in q_det}
    sig = dict.fromkeys(watched, 0.0)
    noise = dict.fromkeys(watched, 0.0)
    for feed in feeds:
        for it in (f_it, q_it):  # as the bundle's runner feeds it: quantized with the input's scale, NHWC
            for n, d in zip(names, it.get_input_details(), strict=True):
                x = np.asarray(feed[n], dtype=np.float32)
                it.set_tensor(d["index"], fw.quantize(x.transpose(0, 2, 3, 1) if nhwc and x.ndim == 4 else x, d))
            it.invoke()
        for t in watched:
            ref = f_it.get_tensor(f_idx[t]).astype(np.float64)
            d = q_det[t]
            got = q_it.get_tensor(d["index"])
            sc, zp = d["quantization_parameters"]["scales"], d["quantization_parameters"]["zero_points"]
            got = (got.astype(np.float64) - (zp[0] if len(zp) else 0)) * sc[0] if len(sc) == 1 else got
            if np.shape(got) != np.shape(ref):
                continue
            sig[t] += float(np.sum(ref ** 2))
            noise[t] += float(np.sum((np.asarray(got, np.float64) - ref) ** 2))

    def rel(t: str) -> float:
        return noise.get(t, 0.0) / sig[t] if sig.get(t) else 0.0

    layers = []
    for op, out, ins in cands:
        added = rel(out) - max((rel(t) for t in ins), default=0.0)
        layers.append(Layer(out, op, float(-10 * np.log10(max(added, 1e-12)))))
    return layers


def _a16_weight_effect(src: Path, built: Path, run: Callable[[Path], list[np.ndarray]], ref: list[np.ndarray],
                       scratch: Path) -> dict[str, float]:
    """Per op with int8 weights in the 16x8 build (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED ...): the model's
    output SNR (dB) against ``ref`` when only that op's weights are rounded as the build rounds them (its int8
    values times its scales, written into the fp32 .tflite's float weights; ``run`` runs a .tflite on the search
    samples). What the local noise cannot see: how much the layers after an op amplify its error (ppocr-cls: its
    first convolution and first depthwise convolution add little noise locally, 44 dB, and cost the output most).
    Keyed by the op's output tensor name; ops whose float weights are not a plain float32 constant are left out."""
    schema = require("ai_edge_litert.schema_py_generated", EXTRA)
    raw = bytearray(src.read_bytes())
    fm = schema.Model.GetRootAs(raw, 0)
    fsg = fm.Subgraphs(0)
    base = np.frombuffer(raw, np.uint8).__array_interface__["data"][0]
    weights: dict[str, tuple[int, int]] = {}  # output tensor -> (offset, bytes) of its float weights in ``raw``
    for i in range(fsg.OperatorsLength()):
        op = fsg.Operators(i)
        if op.OutputsLength() < 1 or op.InputsLength() < 2 or op.Inputs(1) < 0:
            continue
        t = fsg.Tensors(op.Inputs(1))
        data = fm.Buffers(t.Buffer()).DataAsNumpy() if t.Buffer() > 0 else 0
        if t.Type() != schema.TensorType.FLOAT32 or not isinstance(data, np.ndarray) or not data.size:
            continue
        weights[text(fsg.Tensors(op.Outputs(0)).Name())] = (data.__array_interface__["data"][0] - base, data.nbytes)
    g = TFLiteGraph(built)
    out: dict[str, float] = {}
    for _, ins, outs in g.operators():
        if len(ins) < 2 or not outs or g.type_name(ins[1]) != "INT8" or not g.is_const(ins[1]):
            continue
        name = g.tensor_name(outs[0])
        t = g.sg.tensors[ins[1]]
        q = t.quantization
        data = g.model.buffers[t.buffer].data
        if name not in weights or q is None or q.scale is None or data is None:
            continue
        off, n = weights[name]
        w = np.frombuffer(bytes(data), np.int8).astype(np.float32)
        scale = np.asarray(q.scale, np.float32)
        if w.size * 4 != n or scale.size not in (1, int(t.shape[q.quantizedDimension])):
            continue
        shape = [1] * len(t.shape)
        shape[q.quantizedDimension] = -1
        rounded = (w.reshape(t.shape) * (scale.reshape(shape) if scale.size > 1 else scale[0])).astype(np.float32)
        orig = bytes(raw[off:off + n])
        raw[off:off + n] = rounded.tobytes()
        scratch.write_bytes(raw)
        raw[off:off + n] = orig
        out[name] = output_snr_db(ref, run(scratch))
    return out


def _builtin_refusal(path: Path) -> str | None:
    """Why TFLite's builtin kernels (no XNNPACK) refuse to prepare the model, e.g. an int8 LOGISTIC whose output
    scale is not 1/256; None where they load it."""
    litert = require("ai_edge_litert.interpreter", EXTRA)
    try:
        litert.Interpreter(model_path=str(path),
                           experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                           ).allocate_tensors()
    except (RuntimeError, ValueError) as exc:
        return str(exc).strip().splitlines()[0][:240] if str(exc).strip() else type(exc).__name__
    return None


def _refused_node(path: Path) -> tuple[str, str, str] | None:
    """(op, its output tensor's name, LiteRT's reason) where the .tflite fails to load in LiteRT because one node
    failed to prepare; None where it loads. Any other load failure raises as it is."""
    try:
        _interpreter(path, 1)
        return None
    except (RuntimeError, ValueError) as exc:
        found = re.search(r"(?s)(.*?)Node number (\d+) \((\w+)\) failed to prepare", str(exc))
        if not found:
            raise ConversionError(f"{path.name} does not load in LiteRT: {str(exc)[:300]}") from None
        why, k, op = found.group(1).strip().replace("\n", " ")[-200:], int(found.group(2)), found.group(3)
    g = TFLiteGraph(path)
    ops = list(g.operators())
    if k >= len(ops) or not ops[k][2]:
        raise ConversionError(f"{path.name} does not load in LiteRT: node {k} ({op}) failed to prepare: {why}")
    return op, g.tensor_name(ops[k][2][0]), why


def _interpreter(path: Path, threads: int):
    litert = require("ai_edge_litert.interpreter", EXTRA)
    interp = litert.Interpreter(model_path=str(path), num_threads=threads)  # XNNPACK is applied by default
    interp.allocate_tensors()
    return interp


def _dist_version(dist: str) -> str:
    return toolchain_versions(dist).get(dist, "?")


CONVERTER = TFLiteConverter()
