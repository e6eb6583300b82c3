"""A fine-tuned student's activation ranges: a .pt2 that edgekit finetune wrote for jetson carries the ranges its
student trained with; ``--option student_ranges=on`` imposes them over the calibrated ones on the tensors that hold
the same values (edgekit.lineage.student_ranges), so the build computes what the student did."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.tensorrt.qdq import TRT_QDQ_OPS


def impose_student_ranges(job: ConvertJob, pre: Path, feeds: list, ranges: Path) -> tuple[Path, dict | None]:
    """The ranges to build with (the student's over the calibrated ``ranges`` of ``pre`` where asked and found) and
    the manifest's record (None for a model that is no fine-tuned student). Off by default: the student's min/max
    ranges can round more coarsely than the chosen calibration method, and a golden output can then stray past
    the verification gate."""
    from edgekit.lineage import read_record, student_ranges

    asked = str(job.options.get("student_ranges") or "off").lower()  # on / off: TensorRTOptions checks
    if asked == "off":
        rec = read_record(job.model.source) if job.model.kind == "exported_program" else None
        if not isinstance(rec, dict) or not isinstance(rec.get("finetuned_from"), dict):
            return ranges, None
        return ranges, {"applied": False, "chosen": "by --option" if job.options.get("student_ranges")
                        else "default"}
    if not feeds:
        return ranges, None
    with job.substep("student ranges"):
        found = student_ranges(job.model, pre, feeds[0], TRT_QDQ_OPS)
    if found is None:
        return ranges, None
    record = {"points": found["points"], "matched": found["matched"], "chosen": "by --option"}
    if not found["ranges"]:
        why = found.get("reason", "no tensor holds the values of a student's quantized input")
        job.log(f"the fine-tuned student's activation ranges not imposed: {why}")
        return ranges, {**record, "applied": False, "reason": why}
    from onnxruntime.quantization.calibrate import TensorData, TensorsData, load_tensors_data, save_tensors_data

    data = load_tensors_data(str(ranges))
    table = dict(data.data)
    for t, (lo, hi) in found["ranges"].items():
        a = max(-min(lo, 0.0), max(hi, 0.0))  # symmetric, as the student froze it (finetune ActFQ.freeze)
        table[t] = TensorData(lowest=np.array([-a], np.float32), highest=np.array([a], np.float32))
    out = job.work_dir / f"student-{ranges.name}"
    save_tensors_data(TensorsData(data.calibration_method, table), out)
    job.log(f"the fine-tuned student's activation ranges imposed on {len(found['ranges'])} tensor(s) "
            f"({found['matched']} of its {found['points']} quantized inputs matched by value)")
    return out, {**record, "applied": True, "tensors": len(found["ranges"])}
