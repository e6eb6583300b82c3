"""Mixed precision's search primitives, below the converters: layers and their scores, the search a converter
offers, the fewest-layers search, and the rebuild with kept layers. The fallback that drives a converter through
them is :mod:`edgekit.mixed.fallback`, the pipeline's ``mixed`` stage.

A converter offers a :class:`Search`: its candidate layers ranked by a cheap local measure (the quantization
SQNR of each layer's own output activation and weights, one float run), and ``outputs(kept)``, which builds
the model with ``kept`` layers left out of INT8 and runs it on search samples (calibration inputs, never the
golden or eval samples that judge the build). Then:

1. the ``measure`` worst-ranked layers are each kept alone and measured: output SNR against the float model;
2. the layers that gain most are kept together (up to ``max_kept``): where they pass the target's checks on the
   search samples, the fewest of them in order of gain that pass are found (2, 4, 8... then bisection); where
   they gain under GROUP_MIN_GAIN_DB the error is spread over the model and nothing is kept; else layers are
   added one by one in order of measured gain until the search samples pass;
   where the ranking itself measures each layer at the model's output (``Search.by_rank``: jetson), the fewest
   layers ranked worst that pass together are kept instead, found by bisection;
3. the artifact is written with those layers kept and verified for real on the golden (and eval) data; if
   that still fails, the next layers in order are added, each re-verified, up to ``max_kept``.

The verdict the user sees is always that last real verification.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.mixed.eta import Steps

PLOT = "sensitivity.png"
PLOT16 = "sensitivity-16x8.png"  # the 16x8 layer search's (android's last step)
# the 16x8 search runs LiteRT's reference int16 kernels: at most this long per search build's run, in samples
A16_SEARCH_RUN_S = 3.0
A16_SEARCH_BUDGET_S = 240.0
# ... and none where one 16x8 verification took longer: the search re-verifies up to 5 builds, each on LiteRT's
# reference int16 kernels, and a long sequence model would take many minutes
A16_SEARCH_MAX_VERIFY_S = 60.0


@dataclass
class Layer:
    name: str
    op: str
    local_sqnr_db: float  # quantization SQNR of its own output (and weights): the cheap ranking
    alone_snr_db: float | None = None  # model output SNR with only this layer kept (measured)
    gain_db: float | None = None  # alone_snr_db minus the all-INT8 output SNR
    # it reads a model input (through its quantize / dequantize only): the scan measures such layers first. A first
    # layer's input rounding is amplified by every layer after it and its local SQNR does not show that (ddddocr's
    # CRNN: its first convolution ranked 5th locally and gained +2.9 dB kept alone, no other layer over +0.4)
    reads_input: bool = False


@dataclass
class Search:
    layers: list[Layer]  # candidates, any order (ranked here by local_sqnr_db)
    outputs: Callable[[list[str]], list[np.ndarray]]  # build keeping these layers, run on the search samples
    reference: list[np.ndarray]  # the float model's outputs on the search samples
    keeps_as: str  # what a kept layer becomes, e.g. "float (TensorRT picks fp16/fp32 for it)"
    # the calibration method that measured best with these layers kept, where ``outputs`` measures several (a
    # layer kept float changes which activation ranges are best downstream); None: the first build's method
    calibration_for: Callable[[list[str]], str | None] | None = None
    # the ranking measures each layer's rounding at the model's output, alone (jetson: converters/tensorrt/search.py
    # _isolated_snr): the layers are then kept in rank order, the fewest ranked worst together that pass. A layer
    # kept alone measures less than it is worth where the layers after it round again: re-rounding snaps back
    # part of the noise that came before it, which a float layer passes on (an early depthwise convolution can
    # cause half of all-INT8's output noise and still gain nothing kept float alone)
    by_rank: bool = False

    def samples(self) -> int:
        """How many search samples ``outputs`` runs."""
        return len(self.reference[0])


# why a search stopped (Outcome.stopped), as the log and report say it
FOUND = "answer found"
BUDGET = "time budget spent"
SPREAD = "early stop: the error is spread over the model"
UNSHOWN = "early stop: all-INT8 passes the search samples"
TRIED = "every candidate tried"


@dataclass
class Outcome:
    kept: list[Layer]
    scanned: list[Layer]
    snr_db_before: float
    snr_db_after: float
    builds: int
    seconds: float
    keeps_as: str
    passed_search: bool
    steps: list[dict[str, Any]] = field(default_factory=list)  # greedy: kept count -> search SNR / pass
    spread: bool = False  # no layer ranked worst mattered alone: nothing to keep (the error is everywhere)
    spread_why: str = ""  # what was measured to say so
    shown: bool = True  # the search samples showed the failure (all-INT8 failed their checks)
    in_rank_order: bool = False  # kept: the ranked worst together (more are added in rank order too)
    stopped: str = ""  # why the search stopped: FOUND, BUDGET, SPREAD, UNSHOWN, TRIED
    reused: int = 0  # scores given before the search (the sensitivity cache, edgekit.mixed.scores) and used
    reused_layers: int = 0  # ... of them, single layers kept alone (the sensitivity scan's)
    saved_s: float = 0.0  # the time those scores took to measure when they were measured

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kept"] = [asdict(k) for k in self.kept]
        d["scanned"] = [asdict(k) for k in self.scanned]
        return d


def search_feeds(job: Any, n: int = 32) -> list[dict[str, np.ndarray]]:
    """Up to ``n`` calibration samples spread over the file (never the golden or eval samples: the pipeline holds
    those out of --calib), for measuring calibration methods / observers and layer sensitivity."""
    from edgekit.data import draw

    ds = job.calib
    return list(ds.subset(draw(len(ds), n, ds.labels, seed=7)).batches(job.model))


def output_snr_db(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """The worst output's SNR (dB) against the float outputs; +inf where identical."""
    worst = float("inf")
    for r, g in zip(ref, got, strict=True):
        r64, g64 = np.asarray(r, np.float64), np.asarray(g, np.float64).reshape(np.shape(r))
        noise = float(np.sum((g64 - r64) ** 2))
        if not np.isfinite(noise):
            return float("-inf")
        signal = float(np.sum(r64 ** 2))
        snr = float("inf") if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else float("-inf"))
        worst = min(worst, snr)
    return worst


def db(signal: float, noise: float) -> float:
    """10 log10(signal / noise), +inf where there is no noise."""
    return float("inf") if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else float("-inf"))


def quant_noise(x: np.ndarray, amax: float) -> tuple[float, float]:
    """(signal, noise) energies of ``x`` fake-quantized to symmetric INT8 with range ±amax."""
    x = np.asarray(x, np.float64)
    if amax <= 0 or not np.isfinite(amax):
        return float(np.sum(x ** 2)), (0.0 if not np.any(x) else float("inf"))
    s = amax / 127.0
    return float(np.sum(x ** 2)), float(np.sum((np.clip(np.round(x / s), -127, 127) * s - x) ** 2))


def channel_energy(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Sum of squares per channel (axis 1) of ``x`` and the count each sum is over."""
    x = np.asarray(x, np.float64)
    flat = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)
    return (flat ** 2).sum(axis=1), flat.shape[1]


def weight_sqnr_db(w: np.ndarray, in_energy: np.ndarray, out_energy: float, groups: int = 1) -> float:
    """SQNR (dB) of a layer's output when its weights ``w`` ([out, in/groups, ...], per-output-channel symmetric
    INT8) are quantized, for inputs of mean square ``in_energy`` per input channel and a float output of mean
    square ``out_energy`` summed over output channels: the weight error of each input channel weighted by that
    channel's energy. The weights' own SQNR misleads where a large weight meets an input that is always zero
    (its scale rounds every real weight of the row to 0)."""
    w = np.asarray(w, np.float64)
    rows = w.reshape(w.shape[0], w.shape[1], -1)
    s = np.abs(rows).max(axis=(1, 2), keepdims=True) / 127.0
    s[s == 0] = 1.0
    err2 = ((np.round(rows / s) * s - rows) ** 2).sum(axis=2)  # [out, in/groups]
    energy = np.asarray(in_energy, np.float64).reshape(groups, -1)  # [groups, in/groups]
    group_of = np.arange(w.shape[0]) // max(1, w.shape[0] // groups)
    return db(out_energy, float(np.sum(err2 * energy[group_of])))


# Beyond this share of its quantized layers kept at higher precision, an INT8 build is mostly float: one that passes
# every check set for it passes, with a note and a warning that say how many layers stay at higher precision (the
# count does not fail it; one that keeps all of them is refused: nothing is left at INT8); one that still fails is
# told to choose fp16 or fine-tune. The spread search below looks no further than this share of the ranking.
MAX_KEPT_SHARE = 0.5
# Where none of the first SPREAD_AFTER layers of the ranking gains GROUP_MIN_GAIN_DB kept alone, the scan stops: the
# ranking puts a layer that matters first (a detector head whose weights lose most of their resolution), and a
# model whose error is spread would spend the whole time budget keeping layers that change nothing.
SPREAD_AFTER = 4
MIN_GAIN_DB = 0.25
# ... unless the ``max_kept`` layers ranked worst (after those measured to gain MIN_GAIN_DB), kept together, gain
# GROUP_MIN_GAIN_DB: then the error is spread over many layers that matter together (each gains little alone, many
# of them together do), and the fewest of them in that order is searched (bisection, up to MAX_KEPT_SHARE of the
# layers); where even that share does not pass, the error is spread over the model. PP-OCRv4's recognizer on
# android: its first convolution gains +0.9 dB alone, no other of 14 over +0.2 dB; 16 together +1.0 dB.
GROUP_MIN_GAIN_DB = 1.0
# Where the search samples pass all-INT8 (they cannot show the failure, only order the layers to keep first), the
# scan stops after SPREAD_AFTER layers once one of them gains CLEAR_GAIN_DB kept alone: that one is kept first
CLEAR_GAIN_DB = 1.0


Score = dict[str, Any]  # a kept set's measurement: {"snr_db", "passed", "s" (seconds its build and run took)}


def keep_fewest(search: Search, passes: Callable[[list[np.ndarray]], bool], measure: int = 16,
                max_kept: int = 16, log: Callable[[str], None] = lambda m: None, budget_s: float = 300.0,
                scores: dict[tuple[str, ...], Score] | None = None,
                step: Callable[[str, str], None] = lambda name, msg: None) -> Outcome:
    """Steps 1 and 2 of the module's procedure: the layers to keep, chosen on the search samples.
    ``passes(outputs)``: the target's output checks on the search samples. ``scores``: kept sets measured before
    (sorted layer names -> :data:`Score`; the sensitivity cache, :mod:`edgekit.mixed.scores`), used instead of a
    build, and filled with every set this search measures. ``step(name, msg)``: the progress of its two phases,
    ``sensitivity`` (the scan: one build per layer kept alone) and ``keep layers`` (the steps that add layers),
    each step with the time left (:mod:`edgekit.mixed.eta`). The outcome says how long the search took and why
    it stopped (``stopped``); so does its last log line."""
    t0 = time.perf_counter()
    known = scores if scores is not None else {}
    given = set(known)  # measured before this search
    used: set[tuple[str, ...]] = set()
    scan = Steps("sensitivity", step, t0 + budget_s / 2, clock=time.perf_counter)  # the scan: half the budget
    keep = Steps("keep layers", step, t0 + budget_s, unit="step", clock=time.perf_counter)
    out = _keep_fewest(search, passes, measure, max_kept, log, budget_s, t0, known, used, scan, keep)
    scan.end()
    keep.end()
    out.seconds = time.perf_counter() - t0
    out.reused = len(used & given)
    out.reused_layers = sum(1 for k in used & given if len(k) == 1)
    out.saved_s = round(sum(float(known[k].get("s") or 0.0) for k in used & given), 2)
    log(f"layer search: {out.builds} build(s) in {out.seconds:.1f} s"
        + (f" ({out.reused} score(s) from the sensitivity cache)" if out.reused else "") + f"; stopped: {out.stopped}")
    return out


def _keep_fewest(search: Search, passes: Callable[[list[np.ndarray]], bool], measure: int, max_kept: int,
                 log: Callable[[str], None], budget_s: float, t0: float, known: dict[tuple[str, ...], Score],
                 used: set[tuple[str, ...]], scan: Steps, keep: Steps) -> Outcome:
    builds = 0

    def score(kept: list[str], steps: Steps | None = None) -> tuple[float, bool]:
        nonlocal builds
        key = tuple(sorted(kept))
        used.add(key)
        if key not in known:
            t = time.perf_counter()
            got = search.outputs(list(kept))
            builds += 1
            known[key] = {"snr_db": output_snr_db(search.reference, got), "passed": bool(passes(got)),
                          "s": round(time.perf_counter() - t, 3)}
            if steps is not None:
                steps.measured(known[key]["s"])
        return float(known[key]["snr_db"]), bool(known[key]["passed"])

    def spread(measured: list[Layer]) -> Outcome | None:
        """Where the search samples fail all-INT8 and no measured layer gains GROUP_MIN_GAIN_DB kept alone: the
        fewest layers that pass, in rank order (after those measured to gain MIN_GAIN_DB, by gain), where the
        ``max_kept`` first of that order together gain GROUP_MIN_GAIN_DB and half of the layers pass; else the
        spread verdict."""
        if base_ok or not all((x.gain_db or 0) < GROUP_MIN_GAIN_DB for x in measured):
            return None
        lead = sorted((x for x in measured if (x.gain_db or 0) >= MIN_GAIN_DB), key=lambda x: -(x.gain_db or 0))
        seq = ranked if not lead else lead + [x for x in ranked if x not in lead]
        top = max((x.gain_db or 0) for x in measured)
        alone = (f"the {len(measured)} layers ranked worst each gain less than {MIN_GAIN_DB} dB kept alone" if not lead
                 else f"of the {len(measured)} layers measured none gains {GROUP_MIN_GAIN_DB} dB kept alone (at most "
                 f"{top:+.1f} dB)")
        first = "ranked worst" if not lead else "that gain most or rank worst"
        group = min(max_kept, len(ranked))
        limit = max(group, int(MAX_KEPT_SHARE * len(ranked)))
        if time.perf_counter() - t0 <= budget_s and group > len(measured):
            g_snr, g_ok = prefix(group, seq)
            together = f"the {group} {first} together {g_snr - base:+.1f} dB"
            if g_ok:
                log(f"{alone}, {together} and pass: searching the fewest of them in that order")
                return fewest(measured, 2, group, seq)
            if g_snr - base >= GROUP_MIN_GAIN_DB and time.perf_counter() - t0 <= budget_s:
                snr, ok = prefix(limit, seq)
                if ok:
                    log(f"{alone}, {together}, the {limit} {first} ({MAX_KEPT_SHARE:.0%}) pass: searching the "
                        "fewest of them in that order")
                    return fewest(measured, group + 1, limit, seq)
                together += f", the {limit} {first} ({MAX_KEPT_SHARE:.0%}) fail ({snr - base:+.1f} dB)"
            alone += f", {together}"
        log(f"{alone}: the error is spread over the model, not in a few layers; scan stopped")
        return Outcome([], measured, base, base, builds, time.perf_counter() - t0, search.keeps_as, False,
                       [prefixes[k] for k in sorted(prefixes)], spread=True, spread_why=alone, stopped=SPREAD)

    def prefix(k: int, seq: list[Layer] | None = None) -> tuple[float, bool]:
        """The first k of ``seq`` (the ranked worst) kept: output SNR, search checks pass; recorded as a step."""
        snr, ok = score([x.name for x in (ranked if seq is None else seq)[:k]], keep)
        prefixes[k] = {"kept": k, "snr_db": snr, "passed": ok}
        return snr, ok

    def fewest(measured: list[Layer], lo: int, hi: int, seq: list[Layer] | None = None) -> Outcome:
        """The smallest k in [lo, hi] whose first k of ``seq`` (the ranked worst) pass the search checks (hi
        passes), by bisection; in order of gain (``seq`` not the ranking) lo, 2 lo, 4 lo... are tried first."""
        seq = ranked if seq is None else seq
        n = len(prefixes) + max(1, (hi - lo + 1).bit_length())  # the steps of a bisection over [lo, hi], at most
        if seq is not ranked:  # in order of gain the layers that matter come first: lo, 2 lo, 4 lo... then bisect
            k = lo
            while k < hi and time.perf_counter() - t0 <= budget_s:
                keep.start(min(len(prefixes) + 1, n), n)
                if prefix(k, seq)[1]:
                    hi = k
                    break
                lo, k = k + 1, 2 * k
        while lo < hi and time.perf_counter() - t0 <= budget_s:
            mid = (lo + hi) // 2
            keep.start(min(len(prefixes) + 1, n), n)
            if prefix(mid, seq)[1]:
                hi = mid
            else:
                lo = mid + 1
        snr = prefixes[hi]["snr_db"]
        which = "ranked worst" if seq is ranked else "that gain most"
        log(f"{hi} layer(s) kept, the {hi} {which}: output SNR {snr:.1f} dB, search checks pass")
        return Outcome(seq[:hi], measured, base, snr, builds, time.perf_counter() - t0, search.keeps_as, True,
                       [prefixes[k] for k in sorted(prefixes)],
                       stopped=FOUND if lo >= hi else f"{BUDGET} (the set kept passes; a smaller one may too)")

    prefixes: dict[int, dict[str, Any]] = {}  # spread's search: kept count -> its step

    ranked = sorted(search.layers, key=lambda lay: lay.local_sqnr_db)
    first_layers = [lay for lay in ranked if lay.reads_input][:measure // 4]  # a few at most (several inputs)
    scanned = first_layers + [lay for lay in ranked if lay not in first_layers][:measure - len(first_layers)]
    scan.open()  # all-INT8 first, then each layer kept alone
    base, base_ok = score([], scan)
    for i, lay in enumerate(scanned, 1):
        if time.perf_counter() - t0 > budget_s / 2:  # a large graph: the scan gets half the time budget
            log(f"sensitivity scan stopped after {i - 1} layers (time budget {budget_s:.0f} s)")
            scanned = scanned[:i - 1]
            # as below, on the layers the budget allowed: a greedy step over gains of +-0.1 dB keeps layers
            # chosen by measurement noise, which can make the golden agreement worse
            if len(scanned) >= 2 and (out := spread(scanned)) is not None:
                return out
            break
        scan.start(i, len(scanned))
        lay.alone_snr_db, alone_ok = score([lay.name], scan)
        lay.gain_db = lay.alone_snr_db - base
        log(f"sensitivity {i}/{len(scanned)}: {lay.name} ({lay.op}) kept alone: output SNR "
            f"{lay.alone_snr_db:.1f} dB ({lay.gain_db:+.1f})" + (", search checks pass" if alone_ok else ""))
        if alone_ok and not base_ok:  # one layer is the fewest there can be: the rest cannot find a smaller set
            scanned = scanned[:i]
            log(f"1 layer kept: output SNR {lay.alone_snr_db:.1f} dB, search checks pass")
            return Outcome([lay], scanned, base, lay.alone_snr_db, builds, time.perf_counter() - t0,
                           search.keeps_as, True, [{"kept": 1, "layer": lay.name, "snr_db": lay.alone_snr_db,
                                                    "passed": True}], stopped=FOUND)
        if i == SPREAD_AFTER and (out := spread(scanned[:i])) is not None:
            return out
        if i >= SPREAD_AFTER and base_ok and i < len(scanned) and (top := max(
                (x.gain_db for x in scanned[:i] if x.gain_db is not None and np.isfinite(x.gain_db)),
                default=0.0)) >= CLEAR_GAIN_DB:
            # the search samples pass all-INT8: the scan only orders the layers to keep first, each then verified
            # on the golden samples; one that gains this much is kept first whatever the rest measure
            log(f"sensitivity scan stopped after {i} layers: one gains {top:+.1f} dB kept alone (at least "
                f"{CLEAR_GAIN_DB} dB), and the search samples pass all-INT8, so it is kept first")
            scanned = scanned[:i]
            break
    scan.end()
    if base_ok:
        # the search samples pass all-INT8, so they cannot say which layer fails the golden ones; they still
        # measure which layer's rounding costs the output most: the best of those is kept first, and the caller
        # re-verifies on the golden samples, adding the next by gain
        gains = sorted((lay for lay in scanned if lay.gain_db is not None and lay.gain_db >= MIN_GAIN_DB),
                       key=lambda lay: -lay.gain_db)  # NaN compares False: left out; +inf (no noise left): first
        first = gains[:1]
        if first:
            log(f"all-INT8 passes the search checks; keeping first the layer that gains most: {first[0].name} "
                f"({first[0].gain_db:+.1f} dB)")
        return Outcome(first, scanned, base, first[0].alone_snr_db if first else base, builds,
                       time.perf_counter() - t0, search.keeps_as, True, shown=False, stopped=UNSHOWN)
    group = min(max_kept, len(ranked))
    if search.by_rank and group > 1 and time.perf_counter() - t0 <= budget_s:
        keep.open()
        snr, ok = prefix(group)
        if ok:
            log(f"the {group} ranked worst together pass ({snr:.1f} dB): the ranking measures each layer at the "
                "output, so the fewest of them in rank order are searched (kept alone, a layer passes on the "
                "rounding before it that the next rounding had snapped back)")
            out = fewest(scanned, 2, group)
            out.in_rank_order = True
            return out
        log(f"the {group} ranked worst together fail ({snr:.1f} dB): layers are added by measured gain")
    order = sorted(scanned, key=lambda lay: -(lay.gain_db if np.isfinite(lay.gain_db) else 1e9))
    order += [lay for lay in ranked if lay not in scanned]  # beyond the measured ones: by local rank
    most = order[:max_kept]
    if len(most) > 1 and time.perf_counter() - t0 <= budget_s:
        # every layer the greedy step below could keep, kept together first: one build says whether adding them
        # one by one can pass at all (a step per layer, each a build, that gain +-0.1 dB where none can), and
        # where they pass, the fewest of them in that order are found by bisection
        keep.open()
        prefixes.clear()
        snr, ok = prefix(len(most), most)
        together = f"the {len(most)} the search would keep, together, {snr - base:+.1f} dB"
        if ok:
            log(f"{together} and pass: searching the fewest of them in order of gain")
            return fewest(scanned, 2 if scanned else 1, len(most), most)
        if snr - base < GROUP_MIN_GAIN_DB:
            best = max((x.gain_db for x in scanned if x.gain_db is not None and np.isfinite(x.gain_db)), default=0.0)
            why = (f"the {len(scanned)} layers measured gain at most {best:+.1f} dB kept alone, {together} "
                   f"(under {GROUP_MIN_GAIN_DB} dB)")
            log(f"{why}: the error is spread over the model, not in a few layers; search stopped")
            return Outcome([], scanned, base, base, builds, time.perf_counter() - t0, search.keeps_as, False,
                           [prefixes[k] for k in sorted(prefixes)], spread=True, spread_why=why, stopped=SPREAD)
        log(f"{together}, search checks fail: adding layers one by one in order of gain")
        prefixes.clear()
    kept: list[Layer] = []
    steps = []
    ok, snr = False, base
    stopped = TRIED
    n = len(order[:max_kept])
    for lay in order[:max_kept]:
        if time.perf_counter() - t0 > budget_s:
            log(f"search stopped at {len(kept)} kept layer(s): time budget {budget_s:.0f} s")
            stopped = BUDGET
            break
        kept.append(lay)
        keep.start(len(kept), n)
        snr, ok = score([k.name for k in kept], keep)
        steps.append({"kept": len(kept), "layer": lay.name, "snr_db": snr, "passed": ok})
        log(f"{len(kept)} layer(s) kept: output SNR {snr:.1f} dB, search checks {'pass' if ok else 'fail'}")
        if ok:
            stopped = FOUND
            break
    return Outcome(kept, scanned, base, snr, builds, time.perf_counter() - t0, search.keeps_as, ok, steps,
                   stopped=stopped)


def plot(outcome: Outcome, path: Path, title: str) -> bool:
    """Per-layer sensitivity as a bar chart (PNG): output SNR gained by keeping each scanned layer alone at
    higher precision, the kept ones highlighted. False where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    lays = outcome.scanned
    kept = {k.name for k in outcome.kept}
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(lays) + 1.6))
    gains = [lay.gain_db if lay.gain_db is not None and np.isfinite(lay.gain_db) else 0.0 for lay in lays]
    ax.barh(range(len(lays)), gains, color=["tab:red" if lay.name in kept else "tab:gray" for lay in lays])
    ax.set_yticks(range(len(lays)), [f"{lay.name[-40:]} ({lay.op})" for lay in lays], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"output SNR gained when kept alone, dB (all-INT8: {outcome.snr_db_before:.1f} dB)")
    ax.set_title(title + " (red: kept)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def summary(outcome: Outcome) -> list[str]:
    """One line per kept layer, for the CLI notes and report.md."""
    lines = []
    for k in outcome.kept:
        alone = "not measured alone" if k.alone_snr_db is None else (
            f"alone: output SNR {k.alone_snr_db:.1f} dB ({k.gain_db:+.1f} dB)")
        lines.append(f"kept {k.name} ({k.op}) {outcome.keeps_as}: rank SQNR {k.local_sqnr_db:.1f} dB, {alone}")
    return lines


def keep_layers(conv: Any, job: Any, artifact: Any, kept: list[str], calibration: str | None = None) -> Any:
    """A converter's ``keep_layers``: its INT8 build again with ``kept`` nodes (and the user's
    ``keep_float_nodes``) left float, with the calibration method the first build chose, or ``calibration``:
    the one the search measured best with these layers kept."""
    first = artifact.meta["quantization"]
    saved = job.options
    user = [n for n in (saved.get("keep_float_nodes") or []) if n not in kept]
    method = calibration or first["calibration_method"]
    job.options = {**saved, "keep_float_nodes": user + kept, "calibration": method}
    bias = first.get("bias_correction")
    if bias:  # as the first build decided (measured there): off is not measured again on every rebuild
        job.options["bias_correction"] = "on" if bias.get("applied") else "off"
    eq = first.get("depthwise_equalization")
    if eq:  # as the first build decided: the method's cached ranges are of the model it chose
        job.options["equalize"] = "on" if eq.get("applied") else "off"
    # Core ML W8A8's ops kept fp32, as the first build measured them (measuring them again on every rebuild makes
    # a long search many times longer)
    if "fp32_ops" in artifact.meta:
        job.options["fp32_ops"] = artifact.meta["fp32_ops"]
    try:
        again = conv.convert(job)
    finally:
        job.options = saved
    again.meta["quantization"].update({k: first[k] for k in ("calibration_chosen", "calibration_measured_snr_db")})
    if method != first["calibration_method"]:
        again.meta["quantization"]["calibration_chosen"] = (
            f"by measurement with the kept layers float ({first['calibration_method']} measured best all-INT8)")
    if bias and "chosen" in bias:
        again.meta["quantization"]["bias_correction"]["chosen"] = bias["chosen"]
    if eq and "chosen" in eq:
        again.meta["quantization"]["depthwise_equalization"] = eq
    return again
