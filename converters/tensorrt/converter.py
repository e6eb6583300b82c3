"""The tensorrt converter (jetson target): the float ONNX cleaned, then written at the precision asked (fp32,
fp16, or INT8 with explicit Q/DQ: quantize.quantize_int8), the engine built where TensorRT runs here; its host
runner and its mixed-precision hooks."""

from __future__ import annotations

import shutil

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner, load_firmware
from edgekit.converters.tensorrt.engine import build_engine
from edgekit.converters.tensorrt.quantize import quantize_int8
from edgekit.converters.tensorrt.search import layer_search, simulated_vs_real
from edgekit.converters.tensorrt.speed import board_estimate
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError
from edgekit.mixed.search import Search, keep_layers
from edgekit.onnx_fuse import fold_pad_into_maxpool
from edgekit.onnx_graph import export_onnx, prune_opsets, slim, toposort
from edgekit.speed import Speed

PRIMARY = "model.onnx"


class TensorRTConverter:
    name = "tensorrt"

    def convert(self, job: ConvertJob) -> Artifact:
        onnx = require("onnx", "jetson")
        opset = job.opset or job.target.opset or 18
        if job.float_onnx is not None:
            raw = job.float_onnx  # exported once by the analyze stage, at this opset
        else:
            raw = export_onnx(job.model, job.work_dir / "exported.onnx", opset)
        job.log(f"float ONNX (opset {_opset(onnx.load(str(raw)))})")
        clean = job.work_dir / "float.onnx"
        stats = slim(raw, clean)
        job.log(f"onnxslim: {stats['nodes_before']} -> {stats['nodes_after']} nodes")
        proto = onnx.load(str(clean))
        if folded := fold_pad_into_maxpool(proto):  # -inf padding stops onnxruntime's INT8 calibrators
            onnx.save(proto, str(clean))
            stats["pads_folded_into_maxpool"] = folded
            job.log(f"{folded} Pad(-inf) -> MaxPool folded into the pools' own padding")
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
            meta["quantization"] = quantize_int8(job, clean, dest)
            meta["trtexec_flags"] = ["--int8", "--fp16"]
        else:
            raise ConversionError(f"precision {job.precision!r} is not offered by the jetson target (fp32, fp16, int8)")
        meta["engine"] = build_engine(job, dest, notes)
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

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        """The layers an INT8 build may keep out of quantization and a builder for the search (search.py)."""
        return layer_search(job, artifact)

    def keep_layers(self, job: ConvertJob, artifact: Artifact, kept: list[str], calibration: str | None = None
                    ) -> Artifact:
        """The INT8 build again with the kept nodes left out of Q/DQ (edgekit.mixed.search), built for real; its
        output SNR on the search samples recorded against what the simulated graph measured for the same set."""
        again = keep_layers(self, job, artifact, kept, calibration)
        check = simulated_vs_real(job, again, kept)
        if check is not None:
            again.meta["quantization"]["simulated_vs_real"] = check
            job.log(f"kept set of {len(kept)}: output SNR simulated {check['simulated_snr_db']} dB, real build "
                    f"{check['real_snr_db']} dB on the search samples")
        return again

    @staticmethod
    def host_speed(job: ConvertJob, artifact: Artifact) -> Speed | None:
        """The INT8 engine against the fp16 engine on the board, from the cost model (speed.py): onnxruntime on
        this CPU does not stand for TensorRT's kernels."""
        return board_estimate(job, artifact)

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


CONVERTER = TensorRTConverter()
