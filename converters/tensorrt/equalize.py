"""Depthwise equalization before INT8 calibration: each tensor a convolution feeds a depthwise convolution (through
a ReLU or directly; onnx_fuse.equalize_depthwise_inputs) gets channels that span the same range, the scales moved
into the two layers' per-channel weights, where int8 rounds them as before. MobileNet-style nets feed a depthwise
layer channels whose ranges differ by an order of magnitude, and one per-tensor scale leaves the small ones a few
levels.

``--option equalize=off`` (default: where a layer search follows, the equalized build need not end better),
``on`` (equalize_before: the preprocessed model is equalized before calibration) or ``auto``
(equalize_if_better). Where applied, bias correction, the mixed-precision search and its rebuilds (which repeat
the decision as ``on`` / ``off``) build on the equalized model. The equalized model depends on the calibration
data only, not on the nodes kept float."""

from __future__ import annotations

import shutil
from pathlib import Path

from edgekit.converters import ConvertJob
from edgekit.converters.tensorrt.calibration import calibrated_ranges, per_channel
from edgekit.converters.tensorrt.qdq import placement, run_model, write_qdq
from edgekit.deps import require
from edgekit.mixed.search import output_snr_db, search_feeds

EQUALIZE_RANGE_BATCHES = 64  # calibration batches whose largest |x| per channel sets the equalization scales
# calibration samples on which equalize=auto measures the equalized build against the plain: twice the search's,
# where one sample's error can dominate the sum
EQUALIZE_SAMPLES = 64


def equalize_mode(job: ConvertJob) -> str:
    """auto / on / off (TensorRTOptions checks)."""
    return str(job.options.get("equalize") or "off").lower()


def _equalized(job: ConvertJob, pre: Path, feeds: list) -> tuple[object | None, dict]:
    """The equalized model (None where the mode is off or there is no site) and the manifest's record."""
    onnx = require("onnx", "jetson")
    from edgekit.onnx_fuse import depthwise_input_sites, equalize_depthwise_inputs

    chosen = "by --option" if job.options.get("equalize") else "default"
    if equalize_mode(job) == "off":
        return None, {"applied": False, "chosen": chosen}
    proto = onnx.load(str(pre))
    sites = depthwise_input_sites(proto)
    if not sites:
        return None, {"applied": False, "chosen": chosen, "sites": 0,
                      "reason": "no convolution feeds a depthwise convolution (directly or through a ReLU)"}
    with job.substep("depthwise equalization"):
        ranges = per_channel(pre, [s[2].input[0] for s in sites], feeds[:EQUALIZE_RANGE_BATCHES], "absmax")
        done = equalize_depthwise_inputs(proto, sites, ranges)
    job.log(f"depthwise equalization of {len(done)} input(s) (channel ranges spread up to "
            f"{max(d['spread'] for d in done):.1f}x)")
    return proto, {"applied": True, "chosen": chosen, "sites": len(done), "tensors": done}


def equalize_before(job: ConvertJob, pre: Path, feeds: list) -> dict:
    """``equalize=on`` / ``off``: ``pre`` equalized (in place) before calibration; returns the manifest's record."""
    onnx = require("onnx", "jetson")

    proto, record = _equalized(job, pre, feeds)
    if proto is not None:
        onnx.save(proto, str(pre))
    return record


def equalize_if_better(job: ConvertJob, pre: Path, dest: Path, feeds: list, method: str) -> dict:
    """``equalize=auto``: the INT8 build ``dest`` is built again from the equalized model with the same
    calibration ``method`` and kept where the output SNR on up to EQUALIZE_SAMPLES calibration samples rises;
    then ``pre``, ``dest`` and the method's cached ranges are replaced."""
    onnx = require("onnx", "jetson")

    proto, record = _equalized(job, pre, feeds)
    if proto is None:
        return record
    eq = job.work_dir / "equalized.onnx"
    onnx.save(proto, str(eq))
    with job.substep("depthwise equalization"):
        ranges = calibrated_ranges(job, eq, feeds, method, tag="equalized-")
        cand = job.work_dir / "int8-equalized.onnx"
        write_qdq(eq, cand, ranges, method, list(job.options.get("keep_float_nodes") or []), placement(job))
    search = search_feeds(job, EQUALIZE_SAMPLES)
    ref = run_model(pre, search)
    before, after = output_snr_db(ref, run_model(dest, search)), output_snr_db(ref, run_model(cand, search))
    apply = bool(after > before)
    job.log(f"depthwise equalization: output SNR {before:.1f} -> {after:.1f} dB on {len(search)} calibration "
            f"batches: {'applied' if apply else 'not applied'}")
    if apply:
        for stale in job.work_dir.glob("ranges-*.json"):  # other methods' ranges, of the model before
            if not stale.name.startswith("ranges-equalized-"):
                stale.unlink()
        shutil.copyfile(eq, pre)
        shutil.copyfile(ranges, job.work_dir / f"ranges-{method}.json")
        shutil.copyfile(cand, dest)
    return {**record, "applied": apply, "chosen": "by measurement (output SNR dB)",
            "snr_db_before": round(before, 2), "snr_db_after": round(after, 2)}
