"""INT8 activation ranges: the calibration methods (min-max, two percentiles, entropy, MSE), each computed once
per build and cached as onnxruntime's calibration cache, and per-channel statistics of a model's tensors."""

from __future__ import annotations

import contextlib
import gc
import io
from pathlib import Path

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.tensorrt.histograms import stream_histograms
from edgekit.onnx_graph import tensor_values

# the ops whose inputs TensorRT's placement (``--option qdq=tensorrt``, the default; qdq.py) gives Q/DQ pairs
TRT_QDQ_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "AveragePool", "GlobalAveragePool")


def placement(job: ConvertJob) -> str:
    return job.options.get("qdq") or "tensorrt"  # validated by TensorRTOptions (pipeline.convert)


# ``--option calibration=``: name -> (onnxruntime CalibrationMethod, the calibrator's settings, really passed).
# Entropy: TensorRT's KL-divergence threshold over the same 2048-bin |x| histogram the percentile methods read,
# 128 quantized bins (edgekit's _entropy_thresholds; onnxruntime's entropy calibrator computes the same search in a
# Python loop per tensor, many times the rest of an INT8 build on a large model).
# onnxruntime's "Distribution" method is for float8 (its int8 range is the histogram's full range: min-max).
CALIBRATIONS: dict[str, tuple[str, dict]] = {
    "minmax": ("MinMax", {}),
    "percentile": ("Percentile", {"percentile": 99.999, "num_bins": 2048}),
    "percentile-99.99": ("Percentile", {"percentile": 99.99, "num_bins": 2048}),
    "entropy": ("Percentile", {"num_bins": 2048, "num_quantized_bins": 128}),
    # the range whose int8 rounding + clipping error over the histogram is least (pytorch-quantization's "mse",
    # PT2E's HistogramObserver): onnxruntime collects the |x| histogram, edgekit's _mse_thresholds picks the range
    "mse": ("Percentile", {"num_bins": 2048}),
}


def calibrated_ranges(job: ConvertJob, pre: Path, feeds: list, name: str, histograms: dict | None = None,
                      tag: str = "") -> Path:
    """Activation ranges of ``pre`` by calibration method ``name`` with its settings, computed once per build
    (cached in the work folder as onnxruntime's calibration cache). ``histograms``: a dict kept by the caller
    across methods, where the |x| histograms collected once serve every method that reads them (percentile,
    percentile-99.99, mse: 2048 bins each; and min-max, from their first pass), instead of one calibration pass per
    method. ``tag``: another model
    than the build's preprocessed one, cached apart."""
    cache = job.work_dir / f"ranges-{tag}{name}.json"
    if cache.is_file():
        return cache
    from onnxruntime.quantization.calibrate import (CalibrationMethod, HistogramCollector, TensorData,
                                                    TensorsData, create_calibrator, save_tensors_data)

    method, settings = CALIBRATIONS[name]

    class Reader:
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    # min-max reads the signed min and max the histograms' first pass finds: the same numbers as onnxruntime's
    # MinMax calibrator (symmetric: +-the largest |min|, |max| over every batch), without a pass of its own
    shared = histograms is not None and (method == "Percentile" or name == "minmax")
    hist_method, hist_settings = CALIBRATIONS["percentile"] if name == "minmax" else (method, settings)
    with contextlib.redirect_stdout(io.StringIO()):
        collector = histograms.get("percentile") if shared else None
        if collector is None:
            # under TensorRT's placement only the tensors of the ops it quantizes (onnxruntime's calibrator takes
            # every tensor otherwise: ddddocr-det 276, of which its 83 convolutions read 83)
            ops = list(TRT_QDQ_OPS) if placement(job) == "tensorrt" else None
            cal = create_calibrator(pre, ops, augmented_model_path=str(job.work_dir / f"augmented-{tag}{name}.onnx"),
                                    calibrate_method=getattr(CalibrationMethod, hist_method if shared else method),
                                    extra_options={"symmetric": True, **(hist_settings if shared else settings)})
            if not shared and method != "Percentile":
                cal.collect_data(Reader())
                save_tensors_data(cal.compute_data(), cache)
                return cache
            # onnxruntime's collector with its histograms streamed (histograms.py): the same numbers, without
            # every batch's every activation in memory at once (ppocr-det: 69 s and 8.8 GB before, 23 s after)
            collector = HistogramCollector(cal.method, cal.symmetric, cal.num_bins, cal.num_quantized_bins,
                                           cal.percentile, cal.scenario)
            collector.histogram_dict = stream_histograms(cal, feeds)
            # only the histograms are kept for the other methods: a kept calibrator (its session of the
            # all-outputs model) doubles a large model's peak memory at the next collection
            del cal
            gc.collect()
            if shared:
                histograms["percentile"] = collector
        if name == "minmax":
            top = {t: np.nanmax([np.abs(lo), np.abs(hi)], axis=0) for t, (_h, _e, lo, hi) in
                   collector.histogram_dict.items()}
            save_tensors_data(TensorsData(CalibrationMethod.MinMax, {t: (-a, a) for t, a in top.items()}), cache)
            return cache
        if name == "mse":  # the percentile collector's |x| histograms, edgekit's threshold rule
            result = _mse_thresholds(collector.histogram_dict)
        elif name == "entropy":
            result = _entropy_thresholds(collector.histogram_dict)
        else:
            collector.percentile = settings["percentile"]
            result = collector.compute_percentile()
        # the range only: quantize_static reads no more for int8 (the histograms made the cache file ~MBs of JSON)
        save_tensors_data(TensorsData(CalibrationMethod.Percentile,
                                      {t: TensorData(lowest=v[0], highest=v[1]) for t, v in result.items()}), cache)
    return cache


def _mse_thresholds(histograms: dict, levels: int = 127, candidates: int = 256) -> dict:
    """Per tensor, the symmetric int8 range ``±t`` that minimises the squared error of quantizing the values of
    its |x| histogram (each bin at its centre: rounding inside the range, clipping beyond it), over ``candidates``
    thresholds from 1/candidates of the largest |x| to all of it. onnxruntime's percentile collector's histograms
    in, its compute_percentile's result format out: {tensor: (-t, t, hist, edges)}."""
    out = {}
    for tensor, (hist, edges, lo, hi) in histograms.items():
        h = np.asarray(hist, np.float64)
        c = (np.asarray(edges[:-1], np.float64) + np.asarray(edges[1:], np.float64)) / 2
        top = float(edges[-1])
        if top <= 0 or h.sum() == 0:
            t = np.array(top, dtype=edges.dtype)
        else:
            ts = top * np.arange(1, candidates + 1) / candidates
            s = ts[:, None] / levels
            err = ((np.minimum(np.round(c[None, :] / s), levels) * s - c[None, :]) ** 2 * h[None, :]).sum(axis=1)
            t = np.array(ts[int(np.argmin(err))], dtype=edges.dtype)
        out[tensor] = (-t, t, hist, edges)
    return out


def _entropy_thresholds(histograms: dict, quantized_bins: int = 128, stride: int = 8) -> dict:
    """Per tensor, TensorRT's entropy calibration on its |x| histogram: the threshold (a bin edge, every
    ``stride``-th from ``quantized_bins`` up) whose clipped distribution P (the bins beyond it added to its last
    bin) and P quantized to ``quantized_bins`` levels and expanded back (each level's mass spread over its non-empty
    bins) are closest in KL divergence. The same result format as :func:`_mse_thresholds`.

    Every candidate at once, from cumulative sums: with i bins, level g holds the bins j with
    floor(j * levels / i) == g, so its mass and its count of non-empty bins are differences of cumulative sums at
    ceil(g * i / levels); KL(P || Q) is then sums of h log h, h log q and h over the bins below the last one, plus
    the last bin's own term (P's last bin holds the clipped tail; an empty one there counts q at 1e-12)."""
    out = {}
    levels = quantized_bins
    for tensor, (hist, edges, lo, hi) in histograms.items():
        h = np.asarray(hist, np.float64)
        n = len(h)
        best_i = n
        if h.sum() > 0 and n > levels:
            i = np.arange(levels, n + 1, stride)  # candidate bin counts
            full = h > 0
            cum = np.concatenate([[0.0], np.cumsum(h)])  # cum[k]: the mass of h[:k]
            cum_n = np.concatenate([[0.0], np.cumsum(full)])
            cum_hlogh = np.concatenate([[0.0], np.cumsum(np.where(full, h * np.log(np.where(full, h, 1.0)), 0.0))])
            ps, qs = cum[-1], cum[i]
            starts = np.minimum(-((-np.arange(levels + 1)[None, :] * i[:, None]) // levels), i[:, None])
            mass, nz = np.diff(cum[starts], axis=1), np.diff(cum_n[starts], axis=1)
            logq = np.where(nz > 0, np.log(np.where(mass > 0, mass, 1.0) / np.maximum(nz, 1)), 0.0)
            last = i - 1
            h_last = h[last]
            q_last = np.where(h_last > 0, mass[:, -1] / np.maximum(nz[:, -1], 1), 0.0)
            logq_last = np.log(np.where(q_last > 0, q_last, 1.0))
            hlogq = (mass * logq).sum(axis=1) - np.where(h_last > 0, h_last * logq_last, 0.0)  # bins below last
            safe_qs = np.where(qs > 0, qs, 1.0)
            kl = (cum_hlogh[last] - hlogq + cum[last] * (np.log(safe_qs) - np.log(ps))) / ps
            p_last = h_last + (ps - qs)
            pn, qn = p_last / ps, np.maximum(q_last / safe_qs, 1e-12)
            kl = kl + np.where(p_last > 0, pn * np.log(np.where(p_last > 0, pn, 1.0) / qn), 0.0)
            kl = np.where(qs > 0, kl, np.inf)
            if np.isfinite(kl).any():
                best_i = int(i[int(np.argmin(kl))])
        t = np.array(edges[min(best_i, n)], dtype=edges.dtype)
        out[tensor] = (-t, t, hist, edges)
    return out


def per_channel(model, names: list[str], feeds: list, stat: str) -> dict[str, np.ndarray]:
    """Per tensor named in ``model`` (an ONNX path or proto), a statistic per channel (axis 1 of each value) over
    ``feeds``: ``mean`` (bias correction: int8 against float per output channel) or ``absmax``, the largest |x|
    (depthwise equalization's channel ranges)."""
    run = tensor_values(model, names)
    acc: dict[str, np.ndarray] = {}
    count: dict[str, int] = {}
    for f in feeds:
        for name, o in run(f).items():
            o = np.asarray(o, np.float64)
            axes = tuple(a for a in range(o.ndim) if a != 1) if o.ndim > 2 else (0,)  # all but the channel axis
            if stat == "mean":
                acc[name] = acc.get(name, 0) + o.sum(axis=axes)
                count[name] = count.get(name, 0) + int(np.prod([o.shape[a] for a in axes]))
            else:
                top = np.abs(o).max(axis=axes)
                acc[name] = np.maximum(acc[name], top) if name in acc else top
    return {name: v / max(1, count[name]) for name, v in acc.items()} if stat == "mean" else acc
