"""The pipeline's mixed-precision fallback: an INT8 build that failed verification is searched for the layers that
cause it (:mod:`edgekit.mixed.search`), rebuilt with the fewest kept at higher precision and verified again."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters.capabilities import (ACTIVATIONS16, LAYERS, UNSEARCHABLE, Activations16, LayerSearch,
                                             Unsearchable, offered)
from edgekit.errors import ConversionError, UnsupportedOpError
from edgekit.mixed.scores import ScoreStore
from edgekit.mixed.search import (
    A16_SEARCH_BUDGET_S,
    A16_SEARCH_MAX_VERIFY_S,
    BUDGET,
    MAX_KEPT_SHARE,
    MIN_GAIN_DB,
    PLOT,
    PLOT16,
    keep_fewest,
    plot,
    summary,
)


def _first(failures: list[str]) -> str:
    """The first verification failure, and how many more."""
    return failures[0] + (f" and {len(failures) - 1} more" if len(failures) > 1 else "")


def fallback(job: Any, conv: Any, artifact: Any, checked: Any, kinds: dict[str, str], tol: Any,
             reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None], *,
             offers: frozenset[str], extra_steps: int = 4, progress: Callable[[str, str], None] = lambda n, m: None,
             scores: Path | None = None) -> tuple[Any, Any]:
    """An INT8 build failed verification (``checked``); ``offers``: the mixed-precision capabilities the
    registry declares for ``conv`` (``ConverterInfo.mixed``, :mod:`edgekit.converters.capabilities`). Where it
    offers a group of layers to keep first (``group``: android's LSTMs written out in int8), the build again with
    that group at higher precision, re-verified; where it (or there is no group) still fails, the layer search on
    that build (``layers``); where that still fails and it offers 16-bit activations (``activations16``:
    android's 16x8), the build again with every activation int16, re-verified, and where that fails, the same
    layer search on the 16x8 build. Returns the new (artifact, checked); the artifact's meta gets
    ``mixed_precision`` (with ``group``: the first step, ``activations16``: the last) and its notes one line per
    kept layer. ``progress(name, msg)``: the search's progress (its phases and the time left, :mod:`edgekit.mixed.eta`);
    ``scores``: the cache folder whose sensitivity scores the int8 layer search reuses and adds to
    (:mod:`edgekit.mixed.scores`; None: --no-cache)."""
    layers = offered(conv, offers, LAYERS)
    if layers is None:  # nothing to search: the build stays as verified
        return artifact, checked
    artifact, checked = _fallback(job, conv, offers, artifact, checked, kinds, tol, reverify, log, warn,
                                  extra_steps, progress, scores)
    wide = offered(conv, offers, ACTIVATIONS16)
    if checked.verification.passed or wide is None:
        return artifact, checked
    if job.board.int16_activations != "native" and not job.allow_slower_int8:
        why = (f"board {job.board.name} runs 16-bit activations on LiteRT's reference kernels (XNNPACK, GPU and NNAPI "
               "take none): such a build runs many times slower than the fp32 build, which an INT8 build exists to "
               "beat; --allow-slower-int8 tries it")
        artifact.meta.setdefault("mixed_precision", {})["activations16"] = {"built": False, "reason": why,
                                                                            "passed": False}
        checked.verification.notes.append(f"mixed precision: 16-bit activations not tried ({why})")
        log(f"16-bit activations not tried: {why}")
        return artifact, checked
    return _activations16(job, wide, artifact, checked, kinds, tol, reverify, log, warn,
                          lambda name, msg: progress(f"16x8 {name}", msg))


class _A16Layers:
    """A converter's 16x8 layer search as a :class:`LayerSearch` (what ``_layer_fallback`` takes): its search and
    its rebuild with the kept ops float are the 16x8 ones."""

    def __init__(self, conv: Activations16) -> None:
        self.mixed_search = conv.a16_search
        self.keep_layers = conv.a16_keep


def _a16_layer_search(job: Any, conv: Activations16, wide: Any, again: Any, kinds: dict[str, str], tol: Any,
                      reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None],
                      progress: Callable[[str, str], None]) -> tuple[Any, Any, dict[str, Any]]:
    """The 16x8 build failed verification too: the ops whose rounding causes it kept float in it (the same
    keep-fewest search as INT8's). Returns the (artifact, checked) it ends with and its record."""
    log(f"16x8 fails verification too ({_first(again.verification.failures)}): searching its ops to keep float")
    try:
        art, chk = _layer_fallback(job, _A16Layers(conv), None, wide, again, kinds, tol, reverify, log, warn, 4,
                                   label="the 16x8 build", plot_name=PLOT16,
                                   budget_s=min(A16_SEARCH_BUDGET_S, job.search_budget_s), progress=progress)
    except (ConversionError, UnsupportedOpError) as exc:  # a search build ai-edge-quantizer could not write
        why = str(exc).split(": ", 1)[-1][:300]
        return wide, again, {"searched": False, "reason": why, "passed_after": False}
    return art, chk, art.meta.pop("mixed_precision", {})


def _activations16(job: Any, conv: Activations16, artifact: Any, checked: Any, kinds: dict[str, str], tol: Any,
                   reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None],
                   progress: Callable[[str, str], None]) -> tuple[Any, Any]:
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
    if not again.verification.passed:
        if t_verify <= A16_SEARCH_MAX_VERIFY_S:
            wide, again, searched = _a16_layer_search(job, conv, wide, again, kinds, tol, reverify, log, warn,
                                                          progress)
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


def _fallback(job: Any, conv: Any, offers: frozenset[str], artifact: Any, checked: Any, kinds: dict[str, str],
              tol: Any, reverify: Callable[[Any], Any], log: Callable[[str], None], warn: Callable[[str], None],
              extra_steps: int = 4, progress: Callable[[str, str], None] = lambda n, m: None,
              scores: Path | None = None) -> tuple[Any, Any]:
    """The layer search, where the converter offers it (and says whether this job's build path has one)."""
    return _layer_fallback(job, offered(conv, offers, LAYERS), offered(conv, offers, UNSEARCHABLE), artifact,
                           checked, kinds, tol, reverify, log, warn, extra_steps, progress=progress, scores=scores)


# activation observers whose all-INT8 builds measured within TIE_DB of each other on the calibration samples: a
# tie those samples cannot break; where they pass and the golden ones fail with no layer to keep, the other
# observer's build is made and verified (one rebuild)
TIE_DB = 0.5


def _tied_observer(job: Any, conv: Any, artifact: Any, reverify: Callable[[Any], Any],
                   log: Callable[[str], None]) -> tuple[str, Any, Any] | None:
    """The build again with the observer that tied with the chosen one, where it passes verification: (observer,
    artifact, checked); None, and the first build's file back in place, where there is no tie or it fails too."""
    q = artifact.meta.get("quantization") or {}
    measured, chosen = q.get("calibration_measured_snr_db") or {}, q.get("calibration_method")
    if job.options.get("calibration") not in (None, "auto") or measured.get(chosen) is None:
        return None
    other = next((k for k, v in measured.items() if k != chosen and v is not None
                  and abs(float(v) - float(measured[chosen])) <= TIE_DB), None)
    if other is None:
        return None
    log(f"observers {chosen} and {other} tied on the calibration samples ({measured[chosen]:.1f} / "
        f"{measured[other]:.1f} dB): building with {other} and verifying it")
    primary = job.out_dir / artifact.primary
    kept_bytes = primary.read_bytes()
    try:
        again = conv.keep_layers(job, artifact, [], calibration=other)
        chk = reverify(again)
    except (ConversionError, UnsupportedOpError):
        primary.write_bytes(kept_bytes)
        return None
    if not chk.verification.passed:
        primary.write_bytes(kept_bytes)
        log(f"with {other}: verification fails too ({_first(chk.verification.failures)})")
        return None
    again.meta["quantization"]["calibration_chosen"] = (
        f"tied with {chosen} on the calibration samples (within {TIE_DB} dB); the {chosen} build failed verification "
        f"and this one passes")
    return other, again, chk


MIN_SEARCH_S = 10.0  # less left of the INT8 build's budget than this: no search (it would measure a layer or two)


# the substeps of the first build a rebuild with kept layers repeats: the toolchain's own conversion of the
# program (android: calibration from the build's statistics, then litert-torch's lowering; ios: coremltools' MIL
# conversion; jetson: onnxruntime's writing of the Q/DQ model). Not repeated: the calibration-method choice,
# android's fp32 reference, coremltools' import, the simulated graph jetson's choice builds
REPEATED_SUBSTEPS = ("calibration", "TFLite lowering", "MIL conversion", "16x8 quantization", "Q/DQ model")


def rebuild_estimate(job: Any, spent: float) -> float:
    """The seconds a rebuild with kept layers and its re-verification take: the first build's verification and
    the substeps a rebuild repeats (:data:`REPEATED_SUBSTEPS`), as long as they took the first time; ``spent``
    (the first build and its verification, since ``job.started``) where the verification's time is not known."""
    if "verify" not in job.durations:
        return spent
    return job.durations["verify"] + sum(job.durations.get(k, 0.0) for k in REPEATED_SUBSTEPS)


def _advised(spent: float, rebuild_s: float) -> int:
    """A --search-budget that leaves a search of a minute besides the build and its rebuild, in tens of seconds."""
    return -(-round(spent + rebuild_s + 60) // 10) * 10


def _layer_fallback(job: Any, conv: LayerSearch, unsearchable: Unsearchable | None, artifact: Any, checked: Any,
                    kinds: dict[str, str], tol: Any, reverify: Callable[[Any], Any], log: Callable[[str], None],
                    warn: Callable[[str], None], extra_steps: int, label: str = "plain INT8", plot_name: str = PLOT,
                    budget_s: float | None = None, progress: Callable[[str, str], None] = lambda n, m: None,
                    scores: Path | None = None) -> tuple[Any, Any]:
    """The layer search: search, rebuild with the kept layers (``conv.keep_layers``), re-verify with
    ``reverify(artifact)``; not run where ``unsearchable`` says this job's build path keeps no chosen layer.
    ``label``: the build searched, as the messages name it; ``scores``: the cache folder of the sensitivity scores
    (:mod:`edgekit.mixed.scores`; None: not cached)."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    before = list(checked.verification.failures)
    why = unsearchable.mixed_unavailable(job) if unsearchable is not None else None
    if why:  # this build's path has no per-layer control: say so, the build stays failed
        msg = f"mixed precision not searched: {why}"
        warn(msg)
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {"searched": False, "reason": why, "int8_verification_failures": before,
                                            "passed_after": False}
        return artifact, checked
    spent = time.perf_counter() - job.started
    # the INT8 build's time budget covers its search and the rebuild with the layers it keeps (then re-verified):
    # what the build left, less that rebuild's estimate
    rebuild_s = rebuild_estimate(job, spent) if budget_s is None else 0.0
    left = job.search_budget_s - spent - rebuild_s
    if left < MIN_SEARCH_S:
        msg = (f"mixed precision not searched: the INT8 build took {spent:.0f} s of its {job.search_budget_s:.0f} s "
               + (f"budget and a rebuild with kept layers would take about {rebuild_s:.0f} s more" if rebuild_s else
                  "budget")
               + f"; pass --search-budget {_advised(spent, rebuild_s)} or more to search its layers")
        warn(msg)
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {"searched": False, "reason": msg.split(": ", 1)[1],
                                            "int8_verification_failures": before, "passed_after": False}
        return artifact, checked
    warn(f"{label[0].upper() + label[1:]} failed verification ({_first(before)}): searching for the layers that cause "
         "it (--strict fails instead)")
    progress("sensitivity", "start")
    store = ScoreStore.open(scores, job, artifact, tol, kinds, label, log) if scores is not None else None
    t_setup = time.perf_counter()
    search = store.search(lambda: conv.mixed_search(job, artifact)) if store else conv.mixed_search(job, artifact)
    setup_s = time.perf_counter() - t_setup  # the converter's own measures (jetson: each node alone) count too
    names = [s.name for s in job.model.outputs]
    tol_d = tol.model_dump()

    def passes(got: list[np.ndarray]) -> bool:
        return all(smoke.check_output(n, kinds[n], r, g, tol_d, "int8")["passed"]
                   for n, r, g in zip(names, search.reference, got, strict=True))

    budget = left if budget_s is None else min(budget_s, left)
    if budget_s is None:
        log(f"the INT8 build took {spent:.0f} s of its {job.search_budget_s:.0f} s budget (--search-budget) before "
            f"the search; {rebuild_s:.0f} s are kept for the rebuild with the kept layers and its re-verification "
            f"(its verification and the conversion steps it repeats, as long as they took): the search gets {left:.0f} s")
    if setup_s > 1.0:
        log(f"search setup took {setup_s:.1f} s of the {budget:.0f} s budget (--search-budget)")
        if budget_s is None and budget - setup_s < max(MIN_SEARCH_S, setup_s):
            # the setup ran the float model and the build's fake-quant program on the search samples: each search
            # build runs such a program again; where what is left would not hold two, the search would end having
            # measured a layer or none, and keep nothing
            msg = (f"mixed precision not searched: its setup took {setup_s:.0f} s and {max(0.0, budget - setup_s):.0f}"
                   f" s of the --search-budget are left, less than its builds would take (each runs the model on the "
                   f"search samples, as the setup did); pass --search-budget "
                   f"{_advised(spent + setup_s, rebuild_s + setup_s)} or more to search its layers")
            warn(msg)
            checked.verification.notes.append(msg)
            artifact.meta["mixed_precision"] = {"searched": False, "reason": msg.split(": ", 1)[1],
                                                "search_setup_s": round(setup_s, 1),
                                                "int8_verification_failures": before, "passed_after": False}
            return artifact, checked
        budget = max(budget - setup_s, min(budget / 4, MIN_SEARCH_S))
    before_search = set(store.scores) if store else set()
    outcome = keep_fewest(search, passes, log=log, budget_s=budget, step=progress,
                          scores=store.scores if store else None)
    if store is not None:
        if outcome.reused:
            log(f"sensitivity scores from cache ({outcome.reused_layers} layer{'s' * (outcome.reused_layers != 1)}, saved "
                f"{store.saved_s(outcome, search):.1f} s)")
        try:
            store.save(search, before_search)
        except OSError as exc:  # a full or read-only cache never fails a build
            log(f"sensitivity cache not updated: {exc}")
    samples = search.samples()
    if outcome.spread:
        msg = (f"INT8 cannot hold this model on these inputs: no layer explains the failure (kept at higher "
               f"precision, {outcome.spread_why}; all-INT8: {outcome.snr_db_before:.1f} dB output SNR on the "
               "calibration samples): the error is spread over the model; choose --precision fp16 (or fp32), or "
               "fine-tune with `edgekit finetune`")
        warn(msg)
        checked.verification.failures.insert(0, msg)  # the verdict first: the zoo table shows 400 characters
        artifact.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                            "search_samples": samples,
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
        if not outcome.shown and search.calibration_for is not None:
            tied = _tied_observer(job, conv, artifact, reverify, log)
            if tied is not None:
                other, again, chk = tied
                again.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                                 "search_samples": samples, "observer_tie": other,
                                                 "passed_after": True}
                again.notes.insert(0, f"mixed precision: no layer kept; the activation observers measured within "
                                      f"{TIE_DB} dB of each other on the calibration samples, and the build with "
                                      f"{other} passes re-verification")
                return again, chk
        warn(msg)
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                            "search_samples": samples, "passed_after": False}
        return artifact, checked
    ranked = [lay for lay in sorted(search.layers, key=lambda x: x.local_sqnr_db) if lay not in outcome.kept]
    extra = ranked if outcome.in_rank_order else sorted(
        ranked, key=lambda x: -(x.gain_db if x.gain_db is not None and np.isfinite(x.gain_db) else -1e9))
    t0 = time.perf_counter()
    more = extra_steps if outcome.passed_search else 0  # more layers only where the search samples passed
    built = None  # the last (artifact, checked) this loop built
    rebuilt_s = None  # what the first rebuild and its re-verification took
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
            # (litert-torch: a squeeze-excite multiply kept float can break a broadcast): drop it and go on
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
        if rebuilt_s is None:
            rebuilt_s = time.perf_counter() - t0
            log(f"the rebuild with {len(outcome.kept)} kept layer(s) and its re-verification took {rebuilt_s:.0f} s "
                f"(estimated {rebuild_s:.0f} s)")
        if built[1].verification.passed or not extra or more == 0:
            break
        over = (outcome.seconds + time.perf_counter() - t0 > budget if budget_s is not None
                else time.perf_counter() - job.started + rebuilt_s > job.search_budget_s)
        if over:  # each step is a whole build: the budget holds them
            log(f"re-verification failed with {len(outcome.kept)} kept; no more layers tried: the search's time "
                f"budget ({budget:.0f} s, --search-budget) is spent")
            outcome.stopped = f"{BUDGET} (re-verification)"
            break
        more -= 1
        outcome.kept.append(extra.pop(0))  # the search samples passed, the golden ones do not: one more layer
        log(f"re-verification failed with {len(outcome.kept) - 1} kept; adding {outcome.kept[-1].name}")
    if built is None:  # no kept set converted: the build searched stands, failed, and says why
        msg = ("mixed precision: no set of kept layers converts on this path (" + "; ".join(unbuildable)[:400]
               + f"); {label} stays failed")
        checked.verification.notes.append(msg)
        artifact.meta["mixed_precision"] = {**outcome.to_json(), "int8_verification_failures": before,
                                            "search_samples": samples,
                                            "layers": len(search.layers), "unbuildable": unbuildable,
                                            "passed_after": False}
        return artifact, checked
    artifact, checked = built
    outcome.seconds += time.perf_counter() - t0
    v = checked.verification
    checks_ok = v.passed  # the re-verification's own verdict, before the kept count is judged
    kept_n, layers_n = len(outcome.kept), len(search.layers)
    share = kept_n / max(1, layers_n)
    mostly = None  # the note of a build that passes with most of its layers at higher precision
    if kept_n >= layers_n:
        # no layer left at INT8: whatever the checks say, this is not a quantized build
        v.failures.insert(0, (
            f"INT8 cannot hold this model on these inputs: mixed precision had to keep all {layers_n} quantized "
            "layers at higher precision, so no layer runs at INT8 and the build is not an INT8 build; choose "
            "--precision fp16 (or fp32), or fine-tune with `edgekit finetune`"))
    elif share > MAX_KEPT_SHARE and not v.passed:
        # first where the build fails anyway (most layers kept and an output still off):
        # what the user should do next is this, not the last tolerance it misses
        v.failures.insert(0, (
            f"INT8 cannot hold this model on these inputs: mixed precision kept {kept_n} of {layers_n} quantized "
            f"layers at higher precision (more than {MAX_KEPT_SHARE:.0%}) and the build still fails verification; "
            "choose --precision fp16 (or fp32), or fine-tune with `edgekit finetune`"))
    elif share > MAX_KEPT_SHARE:
        # it passes every check set for it: judged by those, not by the count; said plainly, as it is a mixed build
        mostly = (f"mixed build: {kept_n} of {layers_n} quantized layers stay at higher precision ({outcome.keeps_as}) "
                  f"and {layers_n - kept_n} run at INT8; it passes every verification check set for it, but most of "
                  "it is not INT8 (its speed against the fp32 build is the speed check's verdict where the target "
                  "times it, else measure it on the board)")
        warn(mostly)
    record = outcome.to_json()
    if store is not None and outcome.reused:
        record["scores_from_cache"] = {"layers": outcome.reused_layers, "scores": outcome.reused,
                                       "saved_s": store.saved_s(outcome, search)}
    if rebuilt_s is not None and budget_s is None:
        record.update(rebuild_s=round(rebuilt_s, 1), rebuild_s_estimated=round(rebuild_s, 1))
    record.update(int8_verification_failures=before, search_samples=samples,
                  layers=layers_n, kept_share=round(share, 3), passed_after=v.passed)
    if mostly:
        record["mostly_higher_precision"] = mostly
    if unbuildable:
        record["unbuildable"] = unbuildable
        v.notes.append("mixed precision: kept float, these layers do not convert on this path and were left out: "
                       + "; ".join(unbuildable)[:400])
    if plot(outcome, job.out_dir / plot_name, f"{job.model.source}: per-layer sensitivity of {label}"):
        artifact.files.append(plot_name)
        record["plot"] = plot_name
    artifact.meta["mixed_precision"] = record
    head = (f"mixed precision: {label} failed verification; {len(outcome.kept)} layer(s) kept at higher precision "
            f"({outcome.builds} search builds, {outcome.seconds:.1f} s, stopped: {outcome.stopped}"
            + (f"; {outcome.reused} sensitivity score(s) from the cache" if outcome.reused else "")
            + ("" if outcome.shown else "; all-INT8 passes on the calibration samples: kept by the output SNR gained "
               "there, checked on the golden samples") + "); re-verification "
            + ("passed" if v.passed else "passed, but no layer is left at INT8" if checks_ok else "still FAILS"))
    artifact.notes[:0] = [head, *([mostly] if mostly else []), *summary(outcome)]
    if not checks_ok:
        v.notes.append(f"mixed precision kept {len(outcome.kept)} layer(s) and the build still fails verification")
    return artifact, checked


