"""The |x| histograms the percentile, entropy and MSE calibration methods read, streamed batch by batch.

onnxruntime's histogram calibrator keeps every calibrated tensor of every calibration batch in memory, then
histograms each tensor's values at once (on ppocr-det: 8.8 GB resident and over a minute on two cores, most of it
page faults and copies). The histograms here are the same numbers (np.histogram of all of a tensor's |x| values,
2048 bins from the smallest to the largest |x|; the values' signed min and max beside them), computed in two
streamed passes over the same all-outputs session: the first finds each tensor's range, the second adds each
group of batches' histogram over that range. Memory is bounded by :func:`memory_budget` (a quarter of the memory
available, 512 MB to 4 GB): a group is at most GROUP batches and a quarter of the budget, and where all the
calibrated activations fit the budget the first pass keeps them and onnxruntime runs the model once.
YOLOv8 at 640x640 has 0.8 GB of float activations per image: groups of 64 images unbounded by bytes were
killed for memory on a 24 GB host."""

from __future__ import annotations

import os

import numpy as np

GROUP = 64  # batches whose values are reduced together: one numpy call per tensor per group, not per batch
KEEP_BYTES: int | None = None  # the budget (None: memory_budget()); tests set it


def memory_budget() -> int:
    """Bytes of activations the calibration may hold: a quarter of the memory available now, 512 MB to 4 GB."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not Linux: the floor
        avail = 0
    return int(min(4 * 2**30, max(512 * 2**20, avail // 4)))


def stream_histograms(cal, feeds: list) -> dict:
    """``cal``: onnxruntime's HistogramCalibrater for the model (its augmented all-outputs session and the tensors
    it calibrates), nothing collected. Returns ``{tensor: (hist, edges, min, max)}`` as its HistogramCollector's
    ``histogram_dict`` after ``collect_data`` over ``feeds`` (symmetric: histograms of |x|).

    Values are reduced in groups of up to :data:`GROUP` batches and a quarter of the memory budget (a streaming
    model calibrates on a thousand chunks of batch 1: per-batch numpy calls on its small tensors cost more than
    running it), and where every calibrated tensor of every batch fits the budget (:func:`memory_budget`, or
    :data:`KEEP_BYTES` where set) the first pass keeps them and the model runs once."""
    assert cal.symmetric, "the asymmetric collector histograms x, not |x|"
    num_bins = cal.num_bins
    sess = cal.infer_session
    names = [o.name for o in sess.get_outputs()]
    wanted = [(k, n) for k, n in enumerate(names) if n in cal.tensors_to_calibrate]
    budget = KEEP_BYTES if KEEP_BYTES is not None else memory_budget()
    # per tensor: [signed min, signed max, min |x|, max |x|, any values, dtype]
    stats: dict[str, list] = {n: [None, None, None, None, False, None] for _k, n in wanted}
    kept: dict[str, list] | None = {n: [] for _k, n in wanted}
    kept_bytes = 0

    def ranges(group: dict[str, list]) -> None:
        for n, arrs in group.items():
            if not arrs:
                continue
            a = np.concatenate([x.ravel() for x in arrs])
            st = stats[n]
            st[5] = arrs[0].dtype
            if a.size == 0:
                continue
            ab = np.abs(a)
            lo, hi, alo, ahi = np.nanmin(a), np.nanmax(a), ab.min(), ab.max()
            if st[4]:
                lo, hi = min(st[0], lo), max(st[1], hi)
                alo, ahi = min(st[2], alo), max(st[3], ahi)
            stats[n] = [lo, hi, alo, ahi, True, st[5]]

    def groups():
        group: dict[str, list] = {n: [] for _k, n in wanted}
        size = count = 0
        for i, f in enumerate(feeds):
            outs = sess.run(None, f)
            for k, n in wanted:
                group[n].append(np.asarray(outs[k]))
                size += group[n][-1].nbytes
            count += 1
            del outs
            if count == GROUP or size >= budget // 4 or i + 1 == len(feeds):
                yield group
                group = {n: [] for _k, n in wanted}
                size = count = 0

    for group in groups():  # pass 1: each tensor's range (and its values, while they fit)
        ranges(group)
        if kept is not None:
            kept_bytes += sum(a.nbytes for arrs in group.values() for a in arrs)
            if kept_bytes > budget:
                kept = None
            else:
                for n, arrs in group.items():
                    kept[n].extend(arrs)
    hists: dict[str, np.ndarray] = {}
    edges: dict[str, np.ndarray] = {}

    def add(group: dict[str, list]) -> None:
        for n, arrs in group.items():
            st = stats[n]
            if not st[4] or not arrs:
                continue
            a = np.concatenate([x.ravel() for x in arrs])
            if a.size == 0:
                continue
            h, e = np.histogram(np.abs(a), bins=num_bins, range=(st[2], st[3]))
            hists[n] = hists[n] + h if n in hists else h
            edges[n] = e

    if kept is not None:
        add(kept)
        kept = None
    else:
        for group in groups():  # pass 2: the histograms over those ranges, group by group
            add(group)
    out = {}
    for _k, n in wanted:
        lo, hi, _alo, _ahi, seen, dtype = stats[n]
        if not seen:  # onnxruntime: an empty tensor's histogram over [0, 1], its min and max 0
            h, e = np.histogram(np.empty(0, dtype or np.float32), bins=num_bins)
            lo = hi = np.array(0, dtype=dtype or np.float32)
            hists[n], edges[n] = h, e
        out[n] = (hists[n], edges[n].astype(dtype or np.float32), lo, hi)
    return out
