"""The INT8 build: the float model preprocessed, its activation ranges calibrated by the method that measures best
(or the one given; each method measured on one simulated INT8 graph, simulate.py), the student's ranges, depthwise equalization and bias correction where asked, the Q/DQ model
written; returns the manifest's quantization record."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from edgekit.converters import ConvertJob
from edgekit.converters.tensorrt.bias import bias_correction
from edgekit.converters.tensorrt.calibration import CALIBRATIONS, calibrated_ranges
from edgekit.converters.tensorrt.equalize import equalize_before, equalize_if_better, equalize_mode
from edgekit.converters.tensorrt.qdq import TRT_QDQ_OPS, placement, preprocessed, run_model, write_qdq
from edgekit.converters.tensorrt.simulate import method_ranges, simulation
from edgekit.converters.tensorrt.student import impose_student_ranges
from edgekit.deps import require
from edgekit.mixed.search import output_snr_db, search_feeds
from edgekit.onnx_graph import cap_ir_version, prune_opsets


def quantize_int8(job: ConvertJob, src: Path, dest: Path) -> dict:
    onnx = require("onnx", "jetson")
    pre = preprocessed(job, src)
    assert job.calib is not None  # the pipeline refuses int8 without calibration data
    feeds = list(job.calib.batches(job.model))
    excluded = list(job.options.get("keep_float_nodes") or [])
    where = placement(job)
    auto_equalize = equalize_mode(job) == "auto"  # on / off: decided now
    equalized = None if auto_equalize else equalize_before(job, pre, feeds)
    chosen, measured, built = choose_calibration(job, pre, feeds, excluded, where)
    with job.substep("calibration"):
        ranges = calibrated_ranges(job, pre, feeds, chosen)  # computed above where measured (cached)
    imposed, student = impose_student_ranges(job, pre, feeds, ranges)
    if built is not None and imposed == ranges:  # the choice's real build of this method is this build
        shutil.move(built[0], dest)
        job.durations["Q/DQ model"] = built[1]  # what writing it took: a rebuild with kept layers writes one again
    else:
        if built is not None:
            built[0].unlink()
        with job.substep("Q/DQ model"):
            write_qdq(pre, dest, imposed, chosen, excluded, where)
    if auto_equalize and student and student["applied"]:
        equalized = {"applied": False, "chosen": "default", "reason": "the fine-tuned student's activation "
                     "ranges are imposed: equalizing would give their tensors other values"}
    elif auto_equalize:
        equalized = equalize_if_better(job, pre, dest, feeds, chosen)
    bias = bias_correction(job, pre, dest, feeds)
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
        "qdq_placement": where,
        "qdq_placement_is": ("inputs of " + ", ".join(TRT_QDQ_OPS) + " only (TensorRT's guidance; the rest "
                             "runs fp16)") if where == "tensorrt" else "every op onnxruntime quantizes",
        "calibration_method": chosen,
        "calibration_settings": CALIBRATIONS[chosen][1],
        "calibration_chosen": "by measurement (output SNR dB against float)" if measured else "by --option",
        "calibration_measured_snr_db": measured or None,
        "calibration_batches": len(feeds),
        "calibration_source": job.calib.source,
        "nodes_kept_float": excluded,
        **({"student_ranges": student} if student else {}),
        "depthwise_equalization": equalized,
        "bias_correction": bias,
        "quantize_linear": n_q,
        "dequantize_linear": n_dq,
    }


CONFIRM = 2  # calibration=auto: the methods best by simulation that are built and measured for real


def choose_calibration(job: ConvertJob, pre: Path, feeds: list, excluded: list[str],
                       where: str) -> tuple[str, dict[str, float], tuple[Path, float] | None]:
    """The calibration method to build with and, for ``calibration=auto``, each method's output SNR against float
    (dB) on the search samples: every method's ranges are fed as scales to the one simulated INT8 graph
    (simulate.py), which computes what that method's Q/DQ model computes op by op; the CONFIRM best are built
    for real and the best real build wins (its SNR, and the others' simulated ones, are what is returned). The
    third item: the chosen method's real build (its path in the work folder, the seconds writing it took), None
    where the method was given."""
    asked = job.options.get("calibration") or "auto"
    if asked != "auto":
        return asked, {}, None
    search = search_feeds(job)
    histograms: dict = {}  # one |x| histogram collection for the methods that read it
    ranges = {}
    for name in CALIBRATIONS:
        with job.substep(f"calibration ({name})"):
            ranges[name] = calibrated_ranges(job, pre, feeds, name, histograms)
    first = next(iter(CALIBRATIONS))
    with job.substep("simulated INT8 graph"):
        sim = simulation(job, pre, ranges[first], first, excluded, where)
    ref = run_model(pre, search)  # the float model itself: its session optimizes what the simulated one cannot
    simulated = {name: round(output_snr_db(ref, sim.run(search, ranges=method_ranges(ranges[name]))), 2)
                 for name in CALIBRATIONS}
    # the best CONFIRM by simulation are built for real and the best of those wins: onnxruntime runs the real Q/DQ
    # model with fused integer kernels where the simulated graph computes each pair op by op, and on some models
    # that moves a method's output SNR by dBs (ppocr-cls, min-max: 22.7 dB simulated, 18.6 dB real)
    measured = dict(simulated)
    confirmed = sorted(simulated, key=lambda k: -simulated[k])[:CONFIRM]
    builds: dict[str, tuple[Path, float]] = {}
    for name in confirmed:
        t0 = time.perf_counter()
        write_qdq(pre, job.work_dir / f"int8-{name}.onnx", ranges[name], name, excluded, where)
        builds[name] = (job.work_dir / f"int8-{name}.onnx", time.perf_counter() - t0)
        measured[name] = round(output_snr_db(ref, run_model(builds[name][0], search)), 2)
    chosen = max(confirmed, key=lambda k: measured[k])
    for name, (path, _s) in builds.items():
        if name != chosen:
            path.unlink()
    job.log("calibration by measurement (output SNR against float on "
            f"{sum(len(next(iter(f.values()))) for f in search)} calibration samples, one simulated INT8 graph): "
            + ", ".join(f"{k} {v:.1f} dB" for k, v in simulated.items()) + "; built for real: "
            + ", ".join(f"{k} {measured[k]:.1f} dB" for k in confirmed) + f" -> {chosen}")
    return chosen, measured, builds[chosen]
