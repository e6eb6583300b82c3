"""jetson calibration=entropy: TensorRT's KL-divergence threshold search, vectorized over every candidate
threshold (edgekit.converters.tensorrt.calibration._entropy_thresholds), checked against the search written one
threshold at a time."""

from __future__ import annotations


def _entropy_one_by_one(h, edges, levels=128, stride=8):
    """TensorRT's KL threshold search written threshold by threshold: the reference for the vectorized one."""
    import numpy as np

    h = np.asarray(h, np.float64)
    n = len(h)
    best, best_i = np.inf, n
    for i in range(levels, n + 1, stride):
        p = h[:i].copy()
        p[-1] += h[i:].sum()
        group = np.minimum((np.arange(i) * levels) // i, levels - 1)
        mass = np.bincount(group, weights=h[:i], minlength=levels)
        nonzero = np.bincount(group, weights=(h[:i] > 0).astype(np.float64), minlength=levels)
        q = np.where(h[:i] > 0, mass[group] / np.maximum(nonzero[group], 1), 0.0)
        if p.sum() <= 0 or q.sum() <= 0:
            continue
        pn, qn = p / p.sum(), q / q.sum()
        keep = pn > 0
        kl = float(np.sum(pn[keep] * np.log(pn[keep] / np.maximum(qn[keep], 1e-12))))
        if kl < best:
            best, best_i = kl, i
    return edges[min(best_i, n)]


def test_entropy_thresholds_all_at_once_match_the_search_one_by_one():
    """The vectorized KL search (cumulative sums, every candidate at once) picks the threshold the per-threshold
    loop picks, on Gaussian, Laplace, outlier, sparse and gapped histograms."""
    import numpy as np
    from edgekit.converters.tensorrt.calibration import _entropy_thresholds

    rng = np.random.default_rng(1)
    hists = {}
    for k in range(40):
        x = [np.abs(rng.normal(0, 1, 20_000)), np.abs(rng.laplace(0, 1, 20_000)),
             np.abs(np.concatenate([rng.normal(0, 1, 5_000), rng.normal(0, 30, 20)])),
             np.abs(rng.exponential(1, 2_000)) * (rng.random(2_000) < 0.3)][k % 4]
        h, e = np.histogram(x, bins=2048, range=(x.min(), x.max()))
        if k % 5 == 0:
            h[100:400] = 0
        hists[f"t{k}"] = (h, e.astype(np.float32), 0.0, float(x.max()))
    got = _entropy_thresholds(hists)
    for name, (h, e, _, _) in hists.items():
        assert got[name][1] == _entropy_one_by_one(h, e), name
