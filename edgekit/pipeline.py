"""The convert pipeline as one API call; it only orchestrates the stages of :mod:`edgekit.stages`:

    ingest -> analyze -> plan -> data -> convert -> verify -> mixed -> speed -> write

The request is checked first (:mod:`edgekit.request`) and a verified build with the same inputs comes from the
build cache (:mod:`edgekit.cache`). The stage list is checked against the declared order before anything runs;
each stage is timed. The output folder is built as a temporary sibling and renamed into place, so a failed
or killed run leaves nothing half-written. A build whose host verification fails is still
written (so its report can be read) but is marked failed in the manifest, and the call raises
VerificationError afterwards (unless ``fail_on_verification=False``): `edgekit bundle` refuses
such a build.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit import cache as build_cache
from edgekit import stages
from edgekit.analyze import ModelStats
from edgekit.errors import VerificationError
from edgekit.fsutil import atomic_dir, work_dir
from edgekit.ingest import Model
from edgekit.quiet import TOOLCHAIN_LOG, toolchain_output
from edgekit.request import check_request, warn_unshowable_bar
from edgekit.stages import GOLDEN_FILE, bundle_name, check_precision  # noqa: F401 - the pipeline's API
from edgekit.verify import Verification

DEFAULT_BUILD_ROOT = "build"
ORDER = ("ingest", "analyze", "plan", "data", "convert", "verify", "mixed", "speed", "write")
stages.check_order(ORDER)  # at import: a reordered pipeline never starts


@dataclass
class ConvertResult:
    out_dir: Path
    manifest: dict[str, Any]
    verification: Verification
    stats: ModelStats
    timings_s: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cache: dict[str, Any] | None = None  # {"hit", "key", "built_utc"}: the build cache's part (edgekit.cache)


class _Clock:
    """Times each stage and tells the caller (the CLI's progress display) when one starts and ends."""

    def __init__(self, on_stage: Callable[[str, str], None]) -> None:
        self.times: dict[str, float] = {}
        self.on_stage = on_stage
        self.next = iter(ORDER)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        expected = next(self.next)
        if name != expected:  # pragma: no cover - ORDER is checked at import; this is the run following it
            raise RuntimeError(f"stage {name!r} run where {expected!r} belongs")
        self.on_stage(name, "start")
        t0 = time.perf_counter()
        yield
        self.times[name] = time.perf_counter() - t0
        self.on_stage(name, f"{self.times[name]:.2f} s")


def convert(
    model: str | Path | Model,
    target: str = "jetson",
    out: str | Path | None = None,
    board: str | None = None,
    precision: str | None = None,
    calib: str | None = None,
    eval_data: str | None = None,
    input_shape: list[str] | None = None,
    trust_pickle: bool = False,
    consts: list[str] | None = None,
    batch_axes: list[str] | None = None,
    carries: list[str] | None = None,
    sequence_length: int | None = None,
    board_set: list[str] | None = None,
    opset: int | None = None,
    golden_count: int = stages.GOLDEN_DEFAULT,
    options: dict[str, Any] | None = None,
    log: Callable[[str], None] = lambda m: None,
    warn: Callable[[str], None] = lambda m: None,
    on_stage: Callable[[str, str], None] = lambda s, m: None,
    analysis: tuple[ModelStats, Path] | None = None,
    max_data_mb: float | None = None,
    fail_on_verification: bool = True,
    output_kinds: dict[str, str] | None = None,
    eval_output: str | None = None,
    tolerance: dict[str, float] | None = None,
    cache: bool = True,
    cache_dir: str | Path | None = None,
    verbose: bool = False,
    strict: bool = False,
    allow_slower_int8: bool = False,
    search_budget_s: float | None = None,
) -> ConvertResult:
    """Convert ``model`` for ``target`` on ``board`` into the folder ``out`` (default
    ``build/<model>-<target>-<precision>``, the precision as planned).

    ``model`` may be an already loaded :class:`Model` (not loaded again), and ``analysis``
    that Model's ``analyze_model(model, work, target)`` result (stats, float graph), which is
    then not analyzed or exported again: the planner passes both for its builds. ``tolerance`` changes fields of
    the target's tolerances (``{"max_accuracy_drop_points": 2}``; `edgekit matrix` per-cell overrides).

    A build verified before with the same inputs comes from the build cache (:mod:`edgekit.cache`; ``cache=False``
    rebuilds, ``cache_dir`` overrides its folder) without loading any ML framework. The mixed-precision search's
    sensitivity scores are kept there too (:mod:`edgekit.mixed.scores`): another build of the same model with the
    same calibration data reuses them (``cache=False`` neither reads nor writes them).

    What the toolchains print is captured into the build's ``toolchain.log`` (shown live too with
    ``verbose``); ``log``, ``warn`` and ``on_stage`` are edgekit's own messages. ``on_stage`` also hears
    sub-steps of long stages as ``"convert/calibration"`` with ``"start"``, ``"3/16"`` or the time taken.

    An INT8 build is timed against the float build on the target's host runtime where the converter can (the
    ``speed`` stage, :mod:`edgekit.speed`); one slower than float fails verification unless ``allow_slower_int8``.

    ``carries`` (``--carry OUT=IN``): outputs that feed inputs on the next chunk (a recurrent state); the data
    files' chunks are then time, in order, cut into sequences of ``sequence_length`` chunks (edgekit.carry).

    ``search_budget_s``: the time an INT8 build may take with its mixed-precision search (default
    :data:`edgekit.converters.job.SEARCH_BUDGET_S`): the search and its rebuilds get what the first build and its
    verification left of it, and none where they spent it.

    An INT8 build that fails verification gets mixed precision (the ``mixed`` stage, :mod:`edgekit.mixed.fallback`:
    the fewest sensitive layers kept at higher precision, then verified again) unless ``strict``.
    """
    from edgekit.converters import ConvertJob, get_converter

    req = check_request(target, board, board_set, precision, golden_count, opset, max_data_mb, out, tolerance,
                        options, batch_axes, carries, sequence_length)  # every option is checked before any work
    tgt, brd, precision, options = req.target, req.board, req.precision, req.options
    bc = build_cache.open_cache(
        model, tgt, brd, precision, calib=calib, eval_data=eval_data, input_shape=input_shape, consts=consts,
        batch_axes=batch_axes, carries=carries, sequence_length=sequence_length,
        trust_pickle=trust_pickle, opset=opset, golden_count=golden_count, options=options, strict=strict,
        output_kinds=output_kinds, eval_output=eval_output, cache_dir=cache_dir, log=log,
        allow_slower_int8=allow_slower_int8, search_budget_s=search_budget_s) if cache else None
    hit = build_cache.cached_build(bc, out, DEFAULT_BUILD_ROOT, log, warn)
    if hit is not None:
        res = ConvertResult(*hit)
        _record(res, warn)
        return res
    warnings: list[str] = []

    def _warn(msg: str) -> None:
        warnings.append(msg)
        warn(msg)

    clock = _Clock(on_stage)
    with work_dir("edgekit-") as tmp, toolchain_output(echo=verbose) as toolchain:
        work = Path(tmp)
        with clock.stage("ingest"):
            ing = stages.ingest(model, tgt, input_shape, trust_pickle, calib, eval_data, max_data_mb, consts,
                                keras_via_onnx=(options or {}).get("keras") == "onnx", batch_axes=batch_axes,
                                carries=carries, sequence_length=sequence_length)
        with clock.stage("analyze"):
            if analysis is None and bc is not None:  # the float export + analysis, cached without the precision
                analysis = bc.analysis(ing.model, tgt, work, opset, log)
            an = stages.analyze(ing, tgt, work, opset, options, _warn, analysis, precision)
        with clock.stage("plan"):
            planned = stages.plan(ing, an, tgt, brd, precision, log, options)
        with clock.stage("data"):
            prep = stages.data(ing, planned, golden_count, _warn, output_kinds, eval_output)
            warn_unshowable_bar(tolerance, len(prep.golden), prep.kinds, _warn)
        m = ing.model
        if out is None:  # one folder per model, target and precision: builds never collide under build/
            out = Path(DEFAULT_BUILD_ROOT) / bundle_name(m.source, tgt.name, planned.precision)
            log(f"output folder: {out}")
        with atomic_dir(Path(out)) as out_tmp:
            job = ConvertJob(
                model=m, target=tgt, board=brd, precision=planned.precision, calib=prep.calib,
                out_dir=out_tmp, work_dir=work, options=dict(options or {}), log=log, warn=_warn, opset=opset,
                output_kinds=prep.kinds,
                float_onnx=an.float_graph if m.is_torch else None,
                float_tflite=an.float_graph if m.is_tf else None,
                step=lambda name, msg: on_stage(f"convert/{name}", msg), allow_slower_int8=allow_slower_int8,
                **({"search_budget_s": search_budget_s} if search_budget_s is not None else {}),
            )
            conv = get_converter(tgt.converter)
            with clock.stage("convert"):
                artifact = stages.convert(job, conv)
            with clock.stage("verify"):
                tol = tgt.tolerances[planned.precision]
                reference = stages.student_reference(m, artifact.meta, _warn)  # what a student's build imitates

                def check(a: Any) -> Any:  # host verification of an artifact (again after a mixed-precision rebuild)
                    return stages.verify(ing, lambda: conv.host_runner(job, a), prep, tol, a.runtime, planned.precision,
                                         reference)

                checked = check(artifact)
            job.durations["verify"] = clock.times["verify"]  # what a mixed-precision rebuild's re-verification costs
            with clock.stage("mixed"):
                artifact, checked = stages.mixed(
                    job, conv, artifact, checked, prep, tol, check, strict, log, _warn,
                    step=lambda name, msg: on_stage(f"mixed/{name}", msg),
                    scores=build_cache.cache_root(cache_dir) if cache else None)  # sensitivity scores, beside builds
                # the build this stage ends with, once, against the float model a fine-tuned model came from
                stages.against_original(ing.model, lambda: conv.host_runner(job, artifact), prep, tol,
                                        planned.precision, checked.verification, reference)
            with clock.stage("speed"):
                stages.speed(job, conv, artifact, checked, _warn)
            for o in checked.verification.outputs:  # the build's worst samples that did not decide its verdict
                for w in o.warnings:
                    _warn(w)
            with clock.stage("write"):
                toolchain.save(out_tmp / TOOLCHAIN_LOG)  # ends the capture; the manifest lists the log
                manifest = stages.write(out_tmp, m, tgt, brd, planned.precision, artifact, checked, prep.calib,
                                        an.stats, conv.versions(), warnings, clock.times, planned.section, prep.record,
                                        ing.carry)
        verification = checked.verification
        result = ConvertResult(Path(out).resolve(), manifest, verification, an.stats, clock.times, warnings,
                               artifact.notes)
    if verification.passed:  # only verified builds are stored; a failed one is rebuilt each time
        result.cache = build_cache.store_build(bc, result.out_dir, an.stats.to_json(), artifact.notes, manifest, warn)
    _record(result, warn)
    if not verification.passed and fail_on_verification:
        raise VerificationError(
            "host verification failed: " + "; ".join(verification.failures)
            + f" (build kept for inspection in {result.out_dir}, marked failed)"
        )
    return result


def _record(result: ConvertResult, warn: Callable[[str], None]) -> None:
    """The results store (edgekit.results): a full disk or locked db must not fail a finished conversion."""
    try:
        from edgekit.results import manifest_fields, record

        man = result.manifest
        record("convert", **manifest_fields(man), passed=result.verification.passed, out=str(result.out_dir),
               timings_s=man.get("timings_s"), verification=man.get("verification"),
               cache_hit=bool(result.cache and result.cache["hit"]))
    except Exception as exc:  # noqa: BLE001
        warn(f"results store not updated: {exc}")
