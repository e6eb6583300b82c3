"""The android target's converter: which build a job asks for (fp32, fp16, int8-dynamic, int8 by PT2E or by
TensorFlow, 16x8), then the audit of the written .tflite, the notes and the host latency; the mixed-precision
hooks delegate to :mod:`.search`. The target, its precisions and options: :mod:`edgekit.converters.tflite`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from edgekit.converters import Artifact, ConvertJob, Runner, flag_option, load_firmware
from edgekit.converters.tflite import search
from edgekit.converters.tflite.a16 import a16_build
from edgekit.converters.tflite.audit import audit, float_counts, float_io, format_float_ops
from edgekit.converters.tflite.build import convert_torch, float_reference, float_tflite
from edgekit.converters.tflite.interpreter import against_float, builtin_refusal, latency
from edgekit.converters.tflite.options import EXTRA, wide_activations
from edgekit.deps import require, tensorflow_dist, toolchain_versions
from edgekit.errors import ConversionError
from edgekit.keras2 import read_by_tf_keras
from edgekit.mixed.search import Search, keep_layers
from edgekit.speed import Speed
from edgekit.tf_graph import tf_convert


PRIMARY = "model.tflite"
# the ops litert-torch writes a float LSTM out in (per step, between DEQUANTIZE and QUANTIZE)
LSTM_FLOAT_OPS = frozenset({"FULLY_CONNECTED", "BATCH_MATMUL", "LOGISTIC", "TANH", "MUL", "ADD", "SUB", "SLICE",
                            "STRIDED_SLICE", "SPLIT", "SPLIT_V", "CONCATENATION", "RESHAPE", "SQUEEZE", "EXPAND_DIMS",
                            "PACK", "UNPACK", "REVERSE_V2", "TRANSPOSE", "GATHER", "DEQUANTIZE", "QUANTIZE"})


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
            # TensorFlow under the distribution that brought it (tensorflow, else a user's tensorflow-cpu)
            tools = (tensorflow_dist() or "tensorflow", "keras", *(("tf-keras",) if read_by_tf_keras(m) else ()))
            meta: dict[str, Any] = {"layout": layout, "source_layout": m.inputs[0].layout or "as the model",
                                    "converter": "TensorFlow TFLiteConverter", "toolchain": toolchain_versions(*tools)}
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
            meta["quantization"] = a16_build(job, dest, layout)
        elif job.precision == "fp32":
            meta["quantization"] = float_tflite(job, dest, layout)
            t0 -= meta["quantization"].pop("conversion_s", 0.0)  # reused: that conversion's time
        elif m.is_tf:
            meta["quantization"] = tf_convert(m, dest, job.precision, job.calib, job.work_dir, allow_fallback,
                                              log=job.log)
        else:
            if job.precision == "int8":  # lowering refusals before calibration; the speed stage's baseline
                float_reference(job, layout)
            meta["quantization"] = convert_torch(job, dest, layout)
        if job.precision == "int8" and io_kind == "float":
            meta["int8_io"] = audit(dest)["io"]  # the scale/zero point inside the float edges (int16: 16x8)
            n = float_io(dest)
            meta["quantization"]["io"] = "float32 (QUANTIZE/DEQUANTIZE at the edges)"
            job.log(f"io=float: {n} int8 input/output tensor(s) given float32 twins")
        return self._finish(job, dest, meta, notes, t0, io_kind, allow_fallback)


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
        listed_float = (float_counts(rep["float_ops"]) if full_int8 and wide_activations(job)
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
        refused = builtin_refusal(dest)
        meta["builtin_kernels"] = refused or "load"
        if refused:  # host verification runs XNNPACK, which may take what TFLite's own kernels check and refuse
            job.warn(f"{PRIMARY} runs on XNNPACK (host verification) but TFLite's builtin kernels refuse it "
                     f"({refused}): it fails to load where an op falls back to them (GPU / NNAPI delegates, no "
                     "XNNPACK)")
            notes.append(f"TFLite's builtin kernels refuse this model: {refused}")
        if job.precision == "int8":
            meta["full_integer"] = not rep["float_ops"]
            # float LSTMs (the default) account for float ops of the ops they are written out in; another float op
            # (a Sqrt, a Log with no int8 kernel) is refused as in a model without LSTMs
            lstm_kept = (str(meta["quantization"].get("lstm", "")).startswith("float")
                         and all(o["op"] in LSTM_FLOAT_OPS for o in rep["float_ops"]))
            if rep["float_ops"]:
                listed = format_float_ops(rep["float_ops"])
                if wide_activations(job):  # ai-edge-quantizer has no int16 version of some ops (HARD_SWISH)
                    kept = job.options.get("keep_float_tensors") or []
                    notes.append("ops float in the 16x8 build (DEQUANTIZE and QUANTIZE around them; "
                                 + (f"{len(kept)} kept by keep_float_tensors, the others " if kept else "")
                                 + f"ai-edge-quantizer maps no int16 kernel to them): {float_counts(rep['float_ops'])}")
                elif (job.options.get("keep_float_nodes") or lstm_kept
                      or meta["quantization"].get("detection_head_float")):
                    why = " and ".join(w for w, on in (("keep_float_nodes (mixed precision)",
                                                         job.options.get("keep_float_nodes")),
                                                        ("float LSTMs (--option lstm=int8 writes them in int8)",
                                                         lstm_kept),
                                                        ("the detection head's concat (boxes and scores on scales "
                                                         "of their own)",
                                                         meta["quantization"].get("detection_head_float"))) if on)
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
        meta["host_latency_ms"] = latency(dest, (1, 2))
        meta["verify_threads"] = threads
        notes.append("LiteRT interpreter on this host (XNNPACK), median latency: "
                     + ", ".join(f"{k} thread(s) {v:.3f} ms" for k, v in meta["host_latency_ms"].items()))
        return Artifact(
            format="tflite", precision=job.precision, primary=PRIMARY, files=[PRIMARY],
            runtime=f"ai-edge-litert {toolchain_versions('ai-edge-litert').get('ai-edge-litert', '?')} interpreter "
                    f"(XNNPACK, {threads} threads)",
            meta=meta, notes=notes,
        )

    def host_speed(self, job: ConvertJob, artifact: Artifact) -> Speed | None:
        """The build against the fp32 .tflite of the same model and layout, LiteRT with XNNPACK on one thread (what
        a phone's CPU runs; a phone's NNAPI / GPU delegates are not on this host)."""
        if artifact.precision == "fp32":
            return None
        layout = artifact.meta.get("layout") or "nchw"
        base = float_reference(job, layout)  # "source" (Keras / SavedModel): TensorFlow's fp32 conversion
        float_ms, ms, runs, pairs_slower = against_float(base, job.out_dir / artifact.primary)
        q = artifact.meta.get("quantization") or {}
        ops = artifact.meta.get("op_counts") or {}
        n_float = len(artifact.meta.get("float_ops") or [])
        slow = artifact.meta.get("not_delegable_int8") or []
        wide = q.get("activation_bits") == 16
        if wide:
            kernels = (f"16-bit activations: {sum(ops.values()) - n_float} ops on LiteRT's reference int16 kernels "
                       "(XNNPACK, GPU and NNAPI take no int16 activations)")
        else:
            kernels = (f"{sum(ops.values()) - n_float} ops int8 on XNNPACK" if job.precision == "int8"
                       else f"{sum(ops.values())} ops")
        if n_float and job.precision == "int8":
            kernels += f", {n_float} float between DEQUANTIZE and QUANTIZE"
        if slow and job.precision == "int8":
            kernels += f"; no XNNPACK int8 kernel for {', '.join(slow)}"
        native = wide and job.board.int16_activations == "native"
        version = toolchain_versions("ai-edge-litert").get("ai-edge-litert", "?")
        return Speed(runtime=f"LiteRT {version} (XNNPACK, 1 thread)", float_ms=round(float_ms, 4), ms=round(ms, 4),
                     runs=runs, kernels=kernels, judged=not native, pairs_slower=round(pairs_slower, 3),
                     not_judged=(f"board {job.board.name} runs 16-bit activations natively (its NPU); this host runs "
                                 "them on LiteRT's reference kernels" if native else ""))

    # -- mixed precision (edgekit.mixed.search): implemented in search.py

    @staticmethod
    def mixed_unavailable(job: ConvertJob) -> str | None:
        return search.mixed_unavailable(job)

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        return search.mixed_search(job, artifact)

    def activations16(self, job: ConvertJob, artifact: Artifact) -> Artifact | None:
        return search.activations16(self.convert, job, artifact)

    def a16_keep(self, job: ConvertJob, artifact: Artifact, kept: list[str], calibration: str | None = None
                 ) -> Artifact:
        return search.a16_keep(self.convert, job, artifact, kept, calibration)

    def a16_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        return search.a16_search(job, artifact)

    keep_layers = keep_layers  # the int8 build again with the kept fx nodes float (edgekit.mixed.search)

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


CONVERTER = TFLiteConverter()
