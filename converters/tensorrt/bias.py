"""Bias correction of an INT8 Q/DQ model: the mean shift int8 rounding puts in each quantized convolution's /
GEMM's output channels, measured against the float model on calibration samples, taken out of that layer's
float bias (NNCF's bias correction, on the ONNX graph)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.tensorrt.calibration import per_channel
from edgekit.converters.tensorrt.qdq import run_model
from edgekit.deps import require
from edgekit.mixed.search import output_snr_db, search_feeds

BIAS_CORRECTION_BATCHES = 64  # calibration batches whose per-channel means correct the biases, at most ...
BIAS_CORRECTION_WORK = 5e7  # ... and layers x batches x input values per batch at most (8 batches at least): a deep
# model with large inputs (a 416 x 416 detector) measures fewer batches
BIAS_CORRECTION_GROUPS = 128  # sequential measurement rounds at most; more layers are corrected in groups of
# consecutive layers (a later layer of a group is measured before the earlier ones are corrected: auto measures)


def bias_correction(job: ConvertJob, pre: Path, dest: Path, feeds: list) -> dict:
    """Bias correction of the Q/DQ model ``dest`` (in place), kept only where it measures better: layer groups in
    graph order, each measured after the groups before it were corrected. Depthwise convolutions with few weights
    per channel shift most. ``--option bias_correction=off`` (default), ``auto`` (applied if the output SNR on the
    search samples rises), ``on``. Returns the manifest's record."""
    asked = str(job.options.get("bias_correction") or "off").lower()  # auto / on / off: TensorRTOptions checks
    if asked == "off":
        return {"applied": False, "chosen": "by --option" if job.options.get("bias_correction") else "default"}
    cand = job.work_dir / "int8-bias-corrected.onnx"
    with job.substep("bias correction"):
        layers, batches = _correct_biases(pre, dest, cand, feeds)
    if not layers:
        return {"applied": False, "layers": 0, "reason": "no quantized conv / gemm with a bias to correct"}
    search = search_feeds(job)
    ref = run_model(pre, search)
    before, after = output_snr_db(ref, run_model(dest, search)), output_snr_db(ref, run_model(cand, search))
    apply = bool(asked == "on" or after > before)
    job.log(f"bias correction of {layers} layer(s): output SNR {before:.1f} -> {after:.1f} dB on the search "
            f"samples: {'applied' if apply else 'not applied'}")
    if apply:
        shutil.copyfile(cand, dest)
    return {"applied": apply, "chosen": "by --option" if asked == "on" else "by measurement (output SNR dB)",
            "layers": layers, "snr_db_before": round(before, 2), "snr_db_after": round(after, 2),
            "batches": batches}


def _bias_batches(available: int, layers: int, values: int) -> int:
    """How many calibration batches bias correction measures (``values``: input values in one batch)."""
    return int(min(available, BIAS_CORRECTION_BATCHES, max(8, BIAS_CORRECTION_WORK // max(1, layers * values))))


def _batch_values(feed: dict) -> int:
    return int(sum(np.asarray(v).size for v in feed.values()))


def _correct_biases(pre: Path, qdq: Path, dest: Path, feeds: list) -> tuple[int, int]:
    """Write ``qdq`` with each quantized Conv / Gemm's bias corrected to ``dest``; returns how many were corrected
    and on how many calibration batches.
    The correction of a layer is the mean, per output channel, of (int8 model - float model) at its output over
    ``feeds``, measured with every earlier group already corrected, and subtracted from its bias (a Conv without
    one gets one). Layers are taken in graph order, in at most BIAS_CORRECTION_GROUPS groups."""
    onnx = require("onnx", "jetson")
    from onnx import numpy_helper

    q = onnx.load(str(qdq))
    inits = {i.name: i for i in q.graph.initializer}
    made_by = {o: n for n in q.graph.node for o in n.output}

    def quantized_weight(n) -> bool:  # its weight is a DequantizeLinear of an int8 initializer
        w = made_by.get(n.input[1]) if len(n.input) > 1 else None
        return w is not None and w.op_type == "DequantizeLinear" and w.input[0] in inits

    uses: dict[str, int] = {}
    for n in q.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1

    def own_float_bias(n) -> bool:  # a float bias initializer of its own (or none, for a Conv: one is added)
        if len(n.input) > 2 and n.input[2]:
            return n.input[2] in inits and uses[n.input[2]] == 1
        return n.op_type == "Conv"

    # the layer's output must exist in the float model under the same name, to be compared
    fp = onnx.load(str(pre))
    float_names = {o for n in fp.graph.node for o in n.output}
    layers = [n for n in q.graph.node if n.op_type in ("Conv", "Gemm") and quantized_weight(n) and own_float_bias(n)
              and n.output[0] in float_names]
    if not layers:
        return 0, 0
    k = _bias_batches(len(feeds), len(layers), _batch_values(feeds[0]))
    feeds = [feeds[i] for i in np.linspace(0, len(feeds) - 1, k).astype(int)] if k < len(feeds) else feeds

    ref = per_channel(fp, [n.output[0] for n in layers], feeds, "mean")
    size = -(-len(layers) // BIAS_CORRECTION_GROUPS)
    done = 0
    for g in range(0, len(layers), size):
        group = layers[g:g + size]
        got = per_channel(q, [n.output[0] for n in group], feeds, "mean")
        for n in group:
            shift = got[n.output[0]] - ref[n.output[0]]
            if not np.all(np.isfinite(shift)):
                continue
            if len(n.input) > 2 and n.input[2]:
                b = inits[n.input[2]]
                old = numpy_helper.to_array(b)
                if old.size != shift.size:  # a broadcast Gemm bias: left as it is
                    continue
                new = (old.astype(np.float64) - shift.reshape(old.shape)).astype(old.dtype)
                b.CopyFrom(numpy_helper.from_array(new, b.name))
            else:
                name = f"{n.name or n.output[0]}_bias_corrected"
                t = numpy_helper.from_array((-shift.reshape(-1)).astype(np.float32), name)
                q.graph.initializer.append(t)
                inits[name] = q.graph.initializer[-1]
                n.input.append(name)
            done += 1
    onnx.save(q, str(dest))
    return done, len(feeds)
