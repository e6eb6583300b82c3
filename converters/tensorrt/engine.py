"""The TensorRT engine, built here where ``tensorrt`` imports and a GPU is present (with a timing cache); otherwise
the bundle's ``build_engine.sh`` builds it on the board."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edgekit.converters import ConvertJob, load_firmware


def build_engine(job: ConvertJob, onnx_path: Path, notes: list[str]) -> dict:
    """The engine of ``onnx_path`` in the output folder where TensorRT runs here; the manifest's record, and a note
    for the user either way."""
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
