"""Jetson / TensorRT: a TensorRT-ready ONNX (fp32, fp16, or INT8 with explicit Q/DQ).

fp32   exported ONNX, cleaned with onnxslim.
fp16   weights stored as fp16 (onnxruntime's float16 converter), fp32 I/O kept; the
       engine is built with ``--fp16``.
int8   onnxruntime.quantization ``quantize_static`` in QDQ format: symmetric INT8,
       per-channel weights, activation ranges calibrated (MinMax) on the calibration
       set. TensorRT reads the Q/DQ pairs directly (explicit quantization), so no
       calibrator runs on the board.

Where ``tensorrt`` imports and a GPU is present, the engine is built here too (with a
timing cache); otherwise the bundle's ``build_engine.sh`` builds it on the board.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import shutil
from pathlib import Path

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner, load_firmware
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError
from edgekit.onnx_graph import cap_ir_version, export_onnx, prune_opsets, slim, toposort

PRIMARY = "model.onnx"


class TensorRTConverter:
    name = "tensorrt"

    def convert(self, job: ConvertJob) -> Artifact:
        onnx = require("onnx", "jetson")
        opset = job.options.get("opset") or job.target.opset or 18
        if job.float_onnx is not None:
            raw = job.float_onnx  # exported once by the analyze stage, at this opset
        else:
            raw = export_onnx(job.model, job.work_dir / "exported.onnx", opset)
        job.log(f"float ONNX (opset {_opset(onnx.load(str(raw)))})")
        clean = job.work_dir / "float.onnx"
        stats = slim(raw, clean)
        job.log(f"onnxslim: {stats['nodes_before']} -> {stats['nodes_after']} nodes")
        dest = job.out_dir / PRIMARY
        meta: dict = {"opset": _opset(onnx.load(str(clean))), "graph_cleanup": {"tool": "onnxslim", **stats}}
        notes: list[str] = []
        if job.precision == "fp32":
            shutil.copyfile(clean, dest)
            meta["trtexec_flags"] = []
        elif job.precision == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            proto = convert_float_to_float16(onnx.load(str(clean)), keep_io_types=True)
            onnx.save(toposort(prune_opsets(proto)), str(dest))
            meta["trtexec_flags"] = ["--fp16"]
        elif job.precision == "int8":
            meta["quantization"] = self._quantize_int8(job, clean, dest)
            meta["trtexec_flags"] = ["--int8", "--fp16"]
        else:
            raise ConversionError(f"precision {job.precision!r} is not offered by the jetson target (fp32, fp16, int8)")
        meta["engine"] = self._maybe_build_engine(job, dest, notes)
        onnx.checker.check_model(str(dest))
        return Artifact(
            format="onnx",
            precision=job.precision,
            primary=PRIMARY,
            files=[PRIMARY] + (["model.engine", "timing.cache"] if meta["engine"]["built"] else []),
            runtime=f"onnxruntime {require('onnxruntime').__version__} (CPUExecutionProvider)",
            meta=meta,
            notes=notes,
        )

    def _quantize_int8(self, job: ConvertJob, src: Path, dest: Path) -> dict:
        onnx = require("onnx", "jetson")
        q = require("onnxruntime.quantization", "jetson")
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = job.work_dir / "preprocessed.onnx"
        with contextlib.redirect_stdout(io.StringIO()):
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        assert job.calib is not None  # the pipeline refuses int8 without calibration data
        feeds = list(job.calib.batches(job.model))

        class Reader(q.CalibrationDataReader):
            def __init__(self) -> None:
                self.it, self.done = iter(feeds), 0

            def get_next(self):
                feed = next(self.it, None)
                self.done += feed is not None
                job.step("calibration", f"{self.done}/{len(feeds)}")  # a sub-step row in convert's progress
                return feed

        excluded = job.options.get("keep_float_nodes") or []
        method_name = job.options.get("calibration") or "minmax"
        method = {"minmax": q.CalibrationMethod.MinMax, "percentile": q.CalibrationMethod.Percentile}[method_name]
        q.quantize_static(
            str(pre), str(dest), Reader(),
            quant_format=q.QuantFormat.QDQ,
            activation_type=q.QuantType.QInt8,  # TensorRT takes symmetric signed INT8 only
            weight_type=q.QuantType.QInt8,
            per_channel=True,
            calibrate_method=method,
            nodes_to_exclude=excluded,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                           **({"CalibPercentile": 99.999} if method_name == "percentile" else {})},
        )
        proto = prune_opsets(onnx.load(str(dest)))
        cap_ir_version(proto)
        onnx.save(proto, str(dest))
        n_q = sum(1 for n in proto.graph.node if n.op_type == "QuantizeLinear")
        n_dq = sum(1 for n in proto.graph.node if n.op_type == "DequantizeLinear")
        job.log(f"INT8 Q/DQ: {n_q} QuantizeLinear, {n_dq} DequantizeLinear, calibrated on {len(feeds)} batches")
        return {
            "tool": "onnxruntime.quantization.quantize_static",
            "format": "QDQ",
            "weights": "int8 symmetric per-channel",
            "activations": "int8 symmetric per-tensor",
            "calibration_method": method_name,
            "calibration_batches": len(feeds),
            "calibration_source": job.calib.source,
            "nodes_kept_float": excluded,
            "quantize_linear": n_q,
            "dequantize_linear": n_dq,
        }

    def _maybe_build_engine(self, job: ConvertJob, onnx_path: Path, notes: list[str]) -> dict:
        why = _engine_unavailable()
        if why:
            where = ("install TensorRT on this machine (the board) and run build_engine.sh"
                     if job.board.id == "host/host" else "run build_engine.sh on the board")
            notes.append(f"TensorRT engine not built here ({why}); {where}")
            return {"built": False, "reason": why, "build_script": "build_engine.sh"}
        runner = load_firmware("tensorrt")
        engine = job.out_dir / "model.engine"
        runner.build_engine(str(onnx_path), str(engine), job.precision,
                            timing_cache=str(job.out_dir / "timing.cache"), log=job.log)
        import tensorrt as trt

        notes.append(f"TensorRT {trt.__version__} engine built on this machine; it runs only on the same GPU model "
                     "and TensorRT version — the board rebuilds its own with build_engine.sh")
        return {"built": True, "tensorrt": trt.__version__, "file": "model.engine"}

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        # the bundle's own onnxruntime runner (firmware/tensorrt/run.py): the host verifies with
        # the session settings the board's onnxruntime fallback uses
        require("onnxruntime", "jetson")
        model = load_firmware("tensorrt").OnnxRuntimeModel(str(job.out_dir / artifact.primary))
        if len(model.options) > 1:  # recorded in the manifest's warnings: the board's runner retries the same way
            job.warn(f"onnxruntime needed session options {'; '.join(model.options)} to load the artifact")

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return list(model(feeds))

        return run

    @staticmethod
    def versions() -> dict[str, str]:
        return toolchain_versions("torch", "onnx", "onnxruntime", "onnxslim", "onnxscript", "tensorrt")


def _opset(proto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def _engine_unavailable() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    try:
        import tensorrt as trt

        builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
        if builder is None:
            return "TensorRT found no GPU"
    except Exception as exc:  # no GPU, no driver, missing libnvinfer
        return f"TensorRT cannot start: {type(exc).__name__}: {str(exc)[:120]}"
    return None


CONVERTER = TensorRTConverter()
