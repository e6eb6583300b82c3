"""The |x| histograms the percentile, entropy and MSE calibration methods read, streamed batch by batch.

onnxruntime's histogram calibrator keeps every calibrated tensor of every calibration batch in memory, then
histograms each tensor's values at once (on ppocr-det: 8.8 GB resident and over a minute on two cores, most of it
page faults and copies). The histograms here are the same numbers (np.histogram of all of a tensor's |x| values,
2048 bins from the smallest to the largest |x|; the values' signed min and max beside them), computed in two
streamed passes over the same all-outputs session: the first finds each tensor's range, the second adds each
batch's histogram over that range. Memory is one batch's activations; onnxruntime runs the model twice."""

from __future__ import annotations

import numpy as np


def stream_histograms(cal, feeds: list) -> dict:
    """``cal``: onnxruntime's HistogramCalibrater for the model (its augmented all-outputs session and the tensors
    it calibrates), nothing collected. Returns ``{tensor: (hist, edges, min, max)}`` as its HistogramCollector's
    ``histogram_dict`` after ``collect_data`` over ``feeds`` (symmetric: histograms of |x|)."""
    assert cal.symmetric, "the asymmetric collector histograms x, not |x|"
    num_bins = cal.num_bins
    sess = cal.infer_session
    names = [o.name for o in sess.get_outputs()]
    wanted = [(k, n) for k, n in enumerate(names) if n in cal.tensors_to_calibrate]
    # per tensor: [signed min, signed max, min |x|, max |x|, any values, dtype]
    stats: dict[str, list] = {}
    for f in feeds:  # pass 1: each tensor's range
        outs = sess.run(None, f)
        for k, n in wanted:
            a = np.asarray(outs[k])
            st = stats.setdefault(n, [None, None, None, None, False, a.dtype])
            if a.size == 0:
                continue
            ab = np.abs(a)
            lo, hi, alo, ahi = np.nanmin(a), np.nanmax(a), ab.min(), ab.max()
            if st[4]:
                lo, hi = min(st[0], lo), max(st[1], hi)
                alo, ahi = min(st[2], alo), max(st[3], ahi)
            stats[n] = [lo, hi, alo, ahi, True, a.dtype]
        del outs
    hists: dict[str, np.ndarray] = {}
    edges: dict[str, np.ndarray] = {}
    for f in feeds:  # pass 2: the histograms over those ranges, batch by batch
        outs = sess.run(None, f)
        for k, n in wanted:
            st = stats[n]
            if not st[4]:
                continue
            a = np.asarray(outs[k])
            if a.size == 0:
                continue
            h, e = np.histogram(np.abs(a).ravel(), bins=num_bins, range=(st[2], st[3]))
            hists[n] = hists[n] + h if n in hists else h
            edges[n] = e
        del outs
    out = {}
    for _k, n in wanted:
        lo, hi, _alo, _ahi, seen, dtype = stats[n]
        if not seen:  # onnxruntime: an empty tensor's histogram over [0, 1], its min and max 0
            h, e = np.histogram(np.empty(0, dtype), bins=num_bins)
            lo = hi = np.array(0, dtype=dtype)
            hists[n], edges[n] = h, e
        out[n] = (hists[n], edges[n].astype(dtype), lo, hi)
    return out
