"""Mixed precision for an INT8 build that failed verification: find the layers that cause it, keep the fewest
of them at higher precision, re-verify.

A converter offers a :class:`Search`: its candidate layers ranked by a cheap local measure (the quantization
SQNR of each layer's own output activation and weights, one float run), and ``outputs(kept)``, which builds
the model with ``kept`` layers left out of INT8 and runs it on search samples (calibration inputs, never the
golden or eval samples that judge the build). Then:

1. the ``measure`` worst-ranked layers are each kept alone and measured: output SNR against the float model;
2. layers are added greedily in order of measured gain until the search samples pass the target's checks;
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

from edgekit.errors import ConversionError, UnsupportedOpError

PLOT = "sensitivity.png"
PLOT16 = "sensitivity-16x8.png"  # the 16x8 layer search's (android's last step)
# the 16x8 search runs LiteRT's reference int16 kernels: at most this long per search build's run, in samples
A16_SEARCH_RUN_S = 3.0
A16_SEARCH_BUDGET_S = 240.0
# ... and none where one 16x8 verification took longer: the search re-verifies up to 5 builds (ppocr-rec: 0.48 s a
# line on LiteRT's reference kernels, about 80 s a verification; its zoo cell would pass the 900 s limit)
A16_SEARCH_MAX_VERIFY_S = 60.0


@dataclass
class Layer:
    name: str
    op: str
    local_sqnr_db: float  # quantization SQNR of its own output (and weights): the cheap ranking
    alone_snr_db: float | None = None  # model output SNR with only this layer kept (measured)
    gain_db: float | None = None  # alone_snr_db minus the all-INT8 output SNR


@dataclass
class Search:
    layers: list[Layer]  # candidates, any order (ranked here by local_sqnr_db)
    outputs: Callable[[list[str]], list[np.ndarray]]  # build keeping these layers, run on the search samples
    reference: list[np.ndarray]  # the float model's outputs on the search samples
    keeps_as: str  # what a kept layer becomes, e.g. "float (TensorRT picks fp16/fp32 for it)"
    # the calibration method that measured best with these layers kept, where ``outputs`` measures several (a
    # layer kept float changes which activation ranges are best downstream); None: the first build's method
    calibration_for: Callable[[list[str]], str | None] | None = None
    # the ranking measures each layer's rounding at the model's output, alone (jetson: converters/tensorrt.py
    # _isolated_snr): the layers are then kept in rank order, the fewest ranked worst together that pass. A layer
    # kept alone measures less than it is worth where the layers after it round again: re-rounding snaps back
    # part of the noise that came before it, which a float layer passes on (ppocr-cls: its first depthwise
    # convolution's rounding alone is half of all-INT8's output noise, and kept float alone it gains -0.05 dB)
    by_rank: bool = False


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


# An INT8 build may keep at most this share of its quantized layers at higher precision: beyond it the artifact
# is a float build with a few INT8 layers, and calling it INT8 would hide that INT8 failed.
MAX_KEPT_SHARE = 0.5
# Where the first SPREAD_AFTER layers of the ranking each gain less than MIN_GAIN_DB kept alone, the scan stops: the
# ranking puts a layer that matters first (PP-OCRv4's detector head, +9 dB, while its weights were floored), and a
# model whose error is spread would spend the whole time budget keeping layers that change nothing.
SPREAD_AFTER = 4
MIN_GAIN_DB = 0.25
# ... unless the ``max_kept`` layers ranked worst, kept together, gain GROUP_MIN_GAIN_DB: then the error is spread over
# many layers that matter together (ddddocr's YOLOX detector on jetson: each of the 4 worst +0.1 dB alone, the 16
# worst together +5.8 dB, the 24 worst pass), and the fewest of them in rank order is searched (bisection, up to
# MAX_KEPT_SHARE of the layers); where even that share does not pass, the error is spread over the model.
GROUP_MIN_GAIN_DB = 1.0


def keep_fewest(search: Search, passes: Callable[[list[np.ndarray]], bool], measure: int = 16,
                max_kept: int = 16, log: Callable[[str], None] = lambda m: None, budget_s: float = 300.0) -> Outcome:
    """Steps 1 and 2 of the module's procedure: the layers to keep, chosen on the search samples.
    ``passes(outputs)``: the target's output checks on the search samples."""
    t0 = time.perf_counter()
    builds = 0
    cache: dict[tuple[str, ...], tuple[float, bool]] = {}

    def score(kept: list[str]) -> tuple[float, bool]:
        nonlocal builds
        key = tuple(sorted(kept))
        if key not in cache:
            got = search.outputs(list(kept))
            builds += 1
            cache[key] = (output_snr_db(search.reference, got), passes(got))
        return cache[key]

    def spread(measured: list[Layer]) -> Outcome | None:
        """Where the search samples fail all-INT8 and each measured layer gains < MIN_GAIN_DB: the fewest layers in
        rank order that pass, where the ``max_kept`` ranked worst together gain GROUP_MIN_GAIN_DB and half of the
        layers pass; else the spread verdict."""
        if base_ok or not all((x.gain_db or 0) < MIN_GAIN_DB for x in measured):
            return None
        alone = f"the {len(measured)} layers ranked worst each gain less than {MIN_GAIN_DB} dB kept alone"
        group = min(max_kept, len(ranked))
        limit = max(group, int(MAX_KEPT_SHARE * len(ranked)))
        if time.perf_counter() - t0 <= budget_s and group > len(measured):
            g_snr, g_ok = prefix(group)
            together = f"the {group} ranked worst together {g_snr - base:+.1f} dB"
            if g_ok:
                log(f"{alone}, {together} and pass: searching the fewest of them in rank order")
                return fewest(measured, 2, group)
            if g_snr - base >= GROUP_MIN_GAIN_DB and time.perf_counter() - t0 <= budget_s:
                snr, ok = prefix(limit)
                if ok:
                    log(f"{alone}, {together}, the {limit} ranked worst ({MAX_KEPT_SHARE:.0%}) pass: searching the "
                        "fewest of them in rank order")
                    return fewest(measured, group + 1, limit)
                together += f", the {limit} ranked worst ({MAX_KEPT_SHARE:.0%}) fail ({snr - base:+.1f} dB)"
            alone += f", {together}"
        log(f"{alone}: the error is spread over the model, not in a few layers; scan stopped")
        return Outcome([], measured, base, base, builds, time.perf_counter() - t0, search.keeps_as, False,
                       spread=True, spread_why=alone)

    def prefix(k: int) -> tuple[float, bool]:
        """The k ranked worst kept: output SNR, search checks pass; recorded as a step."""
        snr, ok = score([x.name for x in ranked[:k]])
        prefixes[k] = {"kept": k, "snr_db": snr, "passed": ok}
        return snr, ok

    def fewest(measured: list[Layer], lo: int, hi: int) -> Outcome:
        """The smallest k in [lo, hi] whose k ranked worst pass the search checks (hi passes), by bisection."""
        while lo < hi and time.perf_counter() - t0 <= budget_s:
            mid = (lo + hi) // 2
            if prefix(mid)[1]:
                hi = mid
            else:
                lo = mid + 1
        snr = prefixes[hi]["snr_db"]
        log(f"{hi} layer(s) kept, the {hi} ranked worst: output SNR {snr:.1f} dB, search checks pass")
        return Outcome(ranked[:hi], measured, base, snr, builds, time.perf_counter() - t0, search.keeps_as, True,
                       [prefixes[k] for k in sorted(prefixes)])

    prefixes: dict[int, dict[str, Any]] = {}  # spread's search: kept count -> its step

    base, base_ok = score([])
    ranked = sorted(search.layers, key=lambda lay: lay.local_sqnr_db)
    scanned = ranked[:measure]
    for i, lay in enumerate(scanned, 1):
        if time.perf_counter() - t0 > budget_s / 2:  # a large graph: the scan gets half the time budget
            log(f"sensitivity scan stopped after {i - 1} layers (time budget {budget_s:.0f} s)")
            scanned = scanned[:i - 1]
            # as below, on the layers the budget allowed: a greedy step over gains of +-0.1 dB keeps noise
            # (ddddocr-ocr android: 3 measured, then 5 kept and the golden text agreement fell 89.1% -> 87.5%)
            if len(scanned) >= 2 and (out := spread(scanned)) is not None:
                return out
            break
        lay.alone_snr_db, alone_ok = score([lay.name])
        lay.gain_db = lay.alone_snr_db - base
        log(f"sensitivity {i}/{len(scanned)}: {lay.name} ({lay.op}) kept alone: output SNR "
            f"{lay.alone_snr_db:.1f} dB ({lay.gain_db:+.1f})" + (", search checks pass" if alone_ok else ""))
        if alone_ok and not base_ok:  # one layer is the fewest there can be: the rest cannot find a smaller set
            scanned = scanned[:i]
            log(f"1 layer kept: output SNR {lay.alone_snr_db:.1f} dB, search checks pass")
            return Outcome([lay], scanned, base, lay.alone_snr_db, builds, time.perf_counter() - t0,
                           search.keeps_as, True, [{"kept": 1, "layer": lay.name, "snr_db": lay.alone_snr_db,
                                                    "passed": True}])
        if i == SPREAD_AFTER and (out := spread(scanned[:i])) is not None:
            return out
    if base_ok:
        # the search samples pass all-INT8, so they cannot say which layer fails the golden ones; they still
        # measure which layer's rounding costs the output most: the best of those is kept first, and the caller
        # re-verifies on the golden samples, adding the next by gain (ddddocr-ocr android with --option lstm=float:
        # its calibration lines pass, and one golden line's confidence moves 0.246)
        gains = sorted((lay for lay in scanned if lay.gain_db is not None and lay.gain_db >= MIN_GAIN_DB),
                       key=lambda lay: -lay.gain_db)  # NaN compares False: left out; +inf (no noise left): first
        first = gains[:1]
        if first:
            log(f"all-INT8 passes the search checks; keeping first the layer that gains most: {first[0].name} "
                f"({first[0].gain_db:+.1f} dB)")
        return Outcome(first, scanned, base, first[0].alone_snr_db if first else base, builds,
                       time.perf_counter() - t0, search.keeps_as, True, shown=False)
    group = min(max_kept, len(ranked))
    if search.by_rank and group > 1 and time.perf_counter() - t0 <= budget_s:
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
    kept: list[Layer] = []
    steps = []
    ok, snr = False, base
    for lay in order[:max_kept]:
        if time.perf_counter() - t0 > budget_s:
            log(f"search stopped at {len(kept)} kept layer(s): time budget {budget_s:.0f} s")
            break
        kept.append(lay)
        snr, ok = score([k.name for k in kept])
        steps.append({"kept": len(kept), "layer": lay.name, "snr_db": snr, "passed": ok})
        log(f"{len(kept)} layer(s) kept: output SNR {snr:.1f} dB, search checks {'pass' if ok else 'fail'}")
        if ok:
            break
    return Outcome(kept, scanned, base, snr, builds, time.perf_counter() - t0, search.keeps_as, ok, steps)


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


def _first(failures: list[str]) -> str:
    """The first verification failure, and how many more."""
    return failures[0] + (f" and {len(failures) - 1} more" if len(failures) > 1 else "")


def fallback(job: Any, conv: Any, artifact: Any, checked: Any, kinds: dict[str, str], tol: Any,
             reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None],
             extra_steps: int = 4) -> tuple[Any, Any]:
    """An INT8 build failed verification (``checked``): where the converter offers a group of layers to keep first
    (``conv.float_group``: android's LSTMs written out in int8), the build again with that group at higher
    precision, re-verified; where it (or there is no group) still fails, the layer search on that build; where
    that still fails and the converter offers 16-bit activations (``conv.activations16``: android's 16x8), the
    build again with every activation int16, re-verified, and where that fails, the same layer search on the 16x8
    build (``conv.a16_search``). Returns the new (artifact, checked); the artifact's meta gets ``mixed_precision``
    (with ``group``: the first step, ``activations16``: the last) and its notes one line per kept layer."""
    artifact, checked = _fallback(job, conv, artifact, checked, kinds, tol, reverify, log, warn, extra_steps)
    if checked.verification.passed or not hasattr(conv, "activations16"):
        return artifact, checked
    return _activations16(job, conv, artifact, checked, kinds, tol, reverify, log, warn)


class _A16Layers:
    """A converter's 16x8 layer search in the shape ``_layer_fallback`` takes: its search and its rebuild with the
    kept ops float are the 16x8 ones."""

    def __init__(self, conv: Any) -> None:
        self.mixed_search = conv.a16_search
        self.keep_layers = conv.a16_keep


def _a16_layer_search(job: Any, conv: Any, wide: Any, again: Any, kinds: dict[str, str], tol: Any,
                      reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None]
                      ) -> tuple[Any, Any, dict[str, Any]]:
    """The 16x8 build failed verification too: the ops whose rounding causes it kept float in it (the same
    keep-fewest search as INT8's). Returns the (artifact, checked) it ends with and its record."""
    log(f"16x8 fails verification too ({_first(again.verification.failures)}): searching its ops to keep float")
    try:
        art, chk = _layer_fallback(job, _A16Layers(conv), wide, again, kinds, tol, reverify, log, warn, 4,
                                   label="the 16x8 build", plot_name=PLOT16, budget_s=A16_SEARCH_BUDGET_S)
    except (ConversionError, UnsupportedOpError) as exc:  # a search build ai-edge-quantizer could not write
        why = str(exc).split(": ", 1)[-1][:300]
        return wide, again, {"searched": False, "reason": why, "passed_after": False}
    return art, chk, art.meta.pop("mixed_precision", {})


def _activations16(job: Any, conv: Any, artifact: Any, checked: Any, kinds: dict[str, str], tol: Any,
                   reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None]
                   ) -> tuple[Any, Any]:
    """The last step: every activation int16, weights int8 (TFLite's 16x8), and where that fails, its layer
    search. It replaces the failed build only where it passes verification; either way the record says what it
    measured, with both builds' host latency (16x8 runs on LiteRT's reference kernels: the cost the user pays
    for it)."""
    record = artifact.meta.setdefault("mixed_precision", {})
    before = list(checked.verification.failures)
    record.setdefault("int8_verification_failures", before)
    warn(f"INT8 still fails verification ({_first(before)}): building it again with 16-bit activations everywhere "
         "(int8 weights, TFLite's 16x8 mode; --strict fails instead)")
    t0 = time.perf_counter()
    primary = job.out_dir / artifact.primary
    kept_bytes = primary.read_bytes()  # the 16x8 build writes the same file: the int8 one comes back if it fails
    try:
        wide = conv.activations16(job, artifact)
    except (ConversionError, UnsupportedOpError) as exc:
        primary.write_bytes(kept_bytes)
        why = str(exc).split(": ", 1)[-1][:300]
        record["activations16"] = {"built": False, "reason": why, "passed": False}
        checked.verification.notes.append(f"mixed precision: the 16-bit-activation build failed ({why})")
        return artifact, checked
    if wide is None:  # the user chose --option activations
        return artifact, checked
    t_verify = time.perf_counter()
    again = reverify(wide)
    t_verify = time.perf_counter() - t_verify
    searched = None
    if not again.verification.passed and hasattr(conv, "a16_search"):
        if t_verify <= A16_SEARCH_MAX_VERIFY_S:
            wide, again, searched = _a16_layer_search(job, conv, wide, again, kinds, tol, reverify, log, warn)
        else:
            searched = {"searched": False, "passed_after": False,
                        "reason": f"one verification of the 16x8 build took {t_verify:.0f} s on this host (LiteRT's "
                        f"reference int16 kernels), over {A16_SEARCH_MAX_VERIFY_S:.0f} s, and the search re-verifies "
                        "up to 5 builds; keep ops float by hand with --option activations=int16 --option "
                        "keep_float_tensors=<output tensor names>"}
            log(f"16x8 layer search not run: {searched['reason']}")
    v = again.verification
    lat8 = (artifact.meta.get("host_latency_ms") or {}).get("1")
    lat16 = (wide.meta.get("host_latency_ms") or {}).get("1")
    agree = {n: a.get("top1_agreement") for n, a in v.eval_agreement.items() if a.get("top1_agreement") is not None}
    step = {"built": True, "passed": v.passed, "seconds": round(time.perf_counter() - t0, 1),
            "failures": list(v.failures), "eval_top1_agreement": agree or None,
            "host_latency_ms_1_thread": {"int8": lat8, "int16_activations": lat16}}
    if searched is not None:
        step["layer_search"] = searched
        artifact.files += [f for f in wide.files if f == PLOT16 and f not in artifact.files]  # the record names it
    slower = (f"; host latency {lat16:.2f} ms against {lat8:.2f} ms for the int8 build (1 thread)" if lat8 and lat16
              else "")
    if not v.passed:
        primary.write_bytes(kept_bytes)
        record["activations16"] = step
        msg = ("mixed precision: 16-bit activations everywhere were tried and fail verification too "
               f"({_first(v.failures)}){slower}")
        if (searched or {}).get("kept"):  # what the user may still choose, knowing it failed these checks
            msg += (f"; its layer search kept {len(searched['kept'])} op(s) float (eval agreement with float: "
                    + (", ".join(f"{a:.2%}" for a in agree.values()) or "not measured") + "): to build that "
                    "anyway, --option activations=int16 --option keep_float_tensors=<the names in "
                    "artifact.mixed_precision.activations16.layer_search.kept, comma-separated>")
        log(msg)
        checked.verification.notes.append(msg)
        return artifact, checked
    wide.meta["mixed_precision"] = {**record, "activations16": step}  # passed_after: the int8 builds' verdict
    wide.files += [f for f in artifact.files if f not in wide.files]  # the search's sensitivity plot
    kept16 = len((searched or {}).get("kept") or [])
    wide.notes.insert(0, "mixed precision: INT8 activations could not hold this model"
                      + (f" ({len(record['kept'])} layer(s) kept float did not)" if record.get("kept") else "")
                      + "; built again with 16-bit activations everywhere (int8 weights, TFLite 16x8)"
                      + (f", {kept16} op(s) of it kept float" if kept16 else "") + ": re-verification passed"
                      + slower)
    return wide, again


def _fallback(job: Any, conv: Any, artifact: Any, checked: Any, kinds: dict[str, str], tol: Any,
              reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None],
              extra_steps: int = 4) -> tuple[Any, Any]:
    group = conv.float_group(job, artifact) if hasattr(conv, "float_group") else None
    if group is None:
        return _layer_fallback(job, conv, artifact, checked, kinds, tol, reverify, log, warn, extra_steps)
    options, what = group
    before = list(checked.verification.failures)
    warn(f"INT8 failed verification ({_first(before)}): building it again with {what} first (--strict fails "
         "instead)")
    job.options = {**job.options, **options}  # the layer search below and its rebuilds keep the group too
    t0 = time.perf_counter()
    artifact = conv.convert(job)
    checked = reverify(artifact)
    v = checked.verification
    step = {"kept": what, "options": options, "seconds": round(time.perf_counter() - t0, 1), "passed": v.passed,
            "failures": list(v.failures)}
    if v.passed:
        artifact.meta["mixed_precision"] = {"group": step, "kept": [], "int8_verification_failures": before,
                                            "passed_after": True}
        artifact.notes.insert(0, f"mixed precision: plain INT8 failed verification; built again with {what}: "
                                 "re-verification passed")
        return artifact, checked
    log(f"with {what}: verification still fails ({v.failures[0]}); searching its layers")
    artifact, checked = _layer_fallback(job, conv, artifact, checked, kinds, tol, reverify, log, warn, extra_steps)
    artifact.meta["mixed_precision"].update(group=step, int8_verification_failures=before)
    artifact.notes.insert(0, f"mixed precision: {what} first (verification still failed: {v.failures[0]})")
    return artifact, checked


def _layer_fallback(job: Any, conv: Any, artifact: Any, checked: Any, kinds: dict[str, str], tol: Any,
                    reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None],
                    extra_steps: int, label: str = "plain INT8", plot_name: str = PLOT, budget_s: float = 300.0
                    ) -> tuple[Any, Any]:
    """The layer search: search, rebuild with the kept layers (``conv.keep_layers``), re-verify with
    ``reverify(artifact)``. ``label``: the build searched, as the messages name it."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    before = list(checked.verification.failures)
    why = conv.mixed_unavailable(job) if hasattr(conv, "mixed_unavailable") else None
    if why:  # this build's path has no per-layer control: say so, the build stays failed
        msg = f"mixed precision not searched: {why}"
        warn(msg)
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {"searched": False, "reason": why, "int8_verification_failures": before,
                                            "passed_after": False}
        return artifact, checked
    warn(f"{label[0].upper() + label[1:]} failed verification ({_first(before)}): searching for the layers that cause "
         "it (--strict fails instead)")
    search = conv.mixed_search(job, artifact)
    names = [s.name for s in job.model.outputs]
    tol_d = tol.model_dump()

    def passes(got: list[np.ndarray]) -> bool:
        return all(smoke.check_output(n, kinds[n], r, g, tol_d, "int8")["passed"]
                   for n, r, g in zip(names, search.reference, got, strict=True))

    outcome = keep_fewest(search, passes, log=log, budget_s=budget_s)
    if outcome.spread:
        msg = (f"INT8 cannot hold this model on these inputs: no layer explains the failure (kept at higher "
               f"precision, {outcome.spread_why}; all-INT8: {outcome.snr_db_before:.1f} dB output SNR on the "
               "calibration samples): the error is spread over the model; choose --precision fp16 (or fp32), or "
               "fine-tune with `edgekit finetune`")
        warn(msg)
        checked.verification.failures.insert(0, msg)  # the verdict first: the zoo table shows 400 characters
        artifact.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                            "search_samples": int(len(search.reference[0])),
                                            "layers": len(search.layers), "passed_after": False}
        return artifact, checked
    if not outcome.kept:
        if outcome.shown:  # a single search build outlasted the time budget
            msg = (f"mixed precision: the search's time budget ended before it kept a layer ({len(outcome.scanned)} "
                   f"measured in {outcome.seconds:.0f} s); no layer kept, {label} stands")
        else:  # the search samples pass all-INT8 and no layer gains output SNR on them
            msg = ("mixed precision: all-INT8 passes the checks on the calibration samples, so they cannot show which "
                   f"layers fail on the golden ones, and none of the {len(outcome.scanned)} layers measured there "
                   f"gains {MIN_GAIN_DB} dB of output SNR kept alone; no layer kept (calibrate on inputs like those "
                   "that fail)")
        warn(msg)
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                            "search_samples": int(len(search.reference[0])), "passed_after": False}
        return artifact, checked
    ranked = [lay for lay in sorted(search.layers, key=lambda x: x.local_sqnr_db) if lay not in outcome.kept]
    extra = ranked if outcome.in_rank_order else sorted(
        ranked, key=lambda x: -(x.gain_db if x.gain_db is not None and np.isfinite(x.gain_db) else -1e9))
    t0 = time.perf_counter()
    more = extra_steps if outcome.passed_search else 0  # more layers only where the search samples passed
    built = None  # the last (artifact, checked) this loop built
    unbuildable: list[str] = []
    while True:
        try:
            names = [k.name for k in outcome.kept]
            method = None
            if search.calibration_for is not None:
                if search.calibration_for(names) is None:  # a set added after the search: its observer measured
                    search.outputs(names)
                method = search.calibration_for(names)
            rebuilt = (conv.keep_layers(job, artifact, names, calibration=method) if method
                       else conv.keep_layers(job, artifact, names))
        except (ConversionError, UnsupportedOpError) as exc:
            # the search measures kept layers in torch; the target's converter may not lower one kept float
            # (litert-torch: ppocr-cls' SE multiply kept float broke a broadcast): drop it and go on
            lay = outcome.kept.pop()  # the layer added last (the search's own set: its last one)
            why = str(exc).split(": ", 1)[-1][:240]  # without the model's path
            unbuildable.append(f"{lay.name} ({why})")
            warn(f"mixed precision: {lay.name} kept float does not convert ({why}); not kept")
            if built is None and outcome.kept:  # nothing built yet: the search's set without that layer
                continue
            if not outcome.kept or not extra or more == 0:  # else the set before it was built and verified
                break
            more -= 1
            outcome.kept.append(extra.pop(0))
            continue
        built = (rebuilt, reverify(rebuilt))
        if built[1].verification.passed or not extra or more == 0:
            break
        more -= 1
        outcome.kept.append(extra.pop(0))  # the search samples passed, the golden ones do not: one more layer
        log(f"re-verification failed with {len(outcome.kept) - 1} kept; adding {outcome.kept[-1].name}")
    if built is None:  # no kept set converted: the build searched stands, failed, and says why
        msg = ("mixed precision: no set of kept layers converts on this path (" + "; ".join(unbuildable)[:400]
               + f"); {label} stays failed")
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                            "search_samples": int(len(search.reference[0])),
                                            "layers": len(search.layers), "unbuildable": unbuildable,
                                            "passed_after": False}
        return artifact, checked
    artifact, checked = built
    outcome.seconds += time.perf_counter() - t0
    v = checked.verification
    share = len(outcome.kept) / max(1, len(search.layers))
    if share > MAX_KEPT_SHARE:  # silero-vad: all 18 convolutions kept, not one Q/DQ left
        # first where the build fails anyway (jetson silero-vad: 17 of 18 kept and a state still off by 15.7%):
        # what the user should do next is this, not the last tolerance it misses
        v.failures.insert(0, (
            f"INT8 cannot hold this model on these inputs: mixed precision had to keep {len(outcome.kept)} of "
            f"{len(search.layers)} quantized layers at higher precision (more than {MAX_KEPT_SHARE:.0%}), so the "
            "build is not an INT8 build; choose --precision fp16 (or fp32), or fine-tune with `edgekit finetune`"))
    record = outcome.to_json()
    record.update(int8_verification_failures=before, search_samples=int(len(search.reference[0])),
                  layers=len(search.layers), kept_share=round(share, 3), passed_after=v.passed)
    if unbuildable:
        record["unbuildable"] = unbuildable
        v.notes.append("mixed precision: kept float, these layers do not convert on this path and were left out: "
                       + "; ".join(unbuildable)[:400])
    if plot(outcome, job.out_dir / plot_name, f"{job.model.source}: per-layer sensitivity of {label}"):
        artifact.files.append(plot_name)
        record["plot"] = plot_name
    artifact.meta["mixed_precision"] = record
    head = (f"mixed precision: {label} failed verification; {len(outcome.kept)} layer(s) kept at higher precision "
            f"({outcome.builds} search builds, {outcome.seconds:.1f} s"
            + ("" if outcome.shown else "; all-INT8 passes on the calibration samples: kept by the output SNR gained "
               "there, checked on the golden samples") + "); re-verification "
            + ("passed" if v.passed else "still FAILS"))
    artifact.notes[:0] = [head, *summary(outcome)]
    if not v.passed:
        v.notes.append(f"mixed precision kept {len(outcome.kept)} layer(s) and the build still fails verification")
    return artifact, checked


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
    # Core ML W8A8's ops kept fp32, as the first build measured them (measured again on every rebuild, ppocr-rec's
    # search ran past the zoo's 900 s cell limit)
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
