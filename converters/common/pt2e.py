"""PT2E quantization of torch input, the steps every PT2E converter takes: the program to quantize (torch.export,
LSTMs written out where asked), the activation observer (chosen by measurement against float), the calibration
on --calib (``prepare_pt2e`` -> calibrate -> ``convert_pt2e``: the fake-quant program, which runs in torch), and
the mixed search's outputs per kept set. Each converter passes its own quantizer (``quantizer_for(observer)``).
torch and torchao are imported inside the functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgekit.converters.job import ConvertJob
from edgekit.deps import require
from edgekit.errors import ConversionError, InputSpecError
from edgekit.mixed.search import output_snr_db, search_feeds
from edgekit.quiet import quiet_python

SEARCH_CALIB = 64  # calibration samples of each build the observer choice and the mixed-precision search make
# activation observers ``--option calibration=`` chooses from (``auto``: each is measured on the model)
OBSERVERS = ("histogram", "minmax")


def torch_sample(m) -> tuple:
    """The model's example inputs as torch tensors, in input order: what torch.export and lowering trace with."""
    torch = require("torch")
    return tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in m.example_feeds().values())


def torch_module(job: ConvertJob):
    """The nn / fx module to quantize: the .pt2's program as a module, else the torch model itself."""
    m = job.model
    if m.exported is not None:
        return m.exported.module()
    return m.torch_module


def exported_module(job: ConvertJob, module, sample, unroll_lstm: bool = False, found: dict | None = None):
    """The torch.export program PT2E quantizes. ``unroll_lstm``: each ``aten.lstm`` written out step by step
    (torch's own decomposition: one linear for the input projection, then per step a linear of h, the
    gates' sigmoid / tanh, mul and add), which the int8 annotators cover: TFLite then runs the LSTM as
    int8 FULLY_CONNECTED / LOGISTIC / TANH / MUL / ADD (android int8; PT2E has no LSTM annotation).
    ``found``: gets ``lstms``, the number of LSTMs written out."""
    torch = require("torch")
    ep = job.model.exported
    if ep is None:
        try:
            ep = torch.export.export(module, sample)
        except Exception as exc:
            raise ConversionError(explain_export_failure(exc, job.model.source)) from None
    elif not unroll_lstm:
        return module
    lstm = torch.ops.aten.lstm.input
    lstms = sum(1 for n in ep.graph.nodes if n.target == lstm) if unroll_lstm else 0
    if found is not None:
        found["lstms"] = lstms
    if lstms:
        from torch._decomp import get_decompositions

        with quiet_python():
            ep = ep.run_decompositions(get_decompositions([lstm]))
        job.log("LSTM written out step by step for int8 (torch's decomposition): "
                "FULLY_CONNECTED, LOGISTIC, TANH, MUL, ADD per time step")
    return ep.module()


def choose_observer(job: ConvertJob, module, sample, quantizer_for: Callable[[str], Any]
                    ) -> tuple[str, dict[str, float]]:
    """The activation observer and what chose it: ``--option calibration`` as given, else each of OBSERVERS'
    fake-quant programs (``quantizer_for(observer)``, the converter's quantizer) measured against float (output
    SNR) on calibration samples, the best taken."""
    asked = job.options.get("calibration") or "auto"
    if asked != "auto":
        return asked, {}
    m = job.model
    search = search_feeds(job)
    ref = torch_run(module, search, m)
    measured: dict[str, float] = {}
    for name in OBSERVERS:
        with job.substep(f"observer ({name})"):
            conv, _, _ = calibrated(job, module, sample, name, quantizer_for, limit=SEARCH_CALIB)
        measured[name] = round(output_snr_db(ref, torch_run(conv, search, m)), 2)
    chosen = max(measured, key=lambda k: measured[k])
    job.log("activation observer by measurement (output SNR against float on "
            f"{sum(len(next(iter(f.values()))) for f in search)} calibration samples): "
            + ", ".join(f"{k} {v:.1f} dB" for k, v in measured.items()) + f" -> {chosen}")
    return chosen, measured


def calibrated(job: ConvertJob, module, sample, observer: str, quantizer_for: Callable[[str], Any], *,
               dynamic: bool = False, limit: int | None = None, fold: bool = False,
               stats: dict[str, Any] | None = None):
    """prepare_pt2e -> calibrate on --calib (its first ``limit`` samples: the searches) -> convert_pt2e: the
    fake-quant program (runs in torch), with the quantizer ``quantizer_for(observer)``; ``dynamic``: no
    calibration data (one run of ``sample``). ``fold``: weights as int8 constants (what coremltools reads)
    instead of quantize ops. ``stats``: the mixed search's store, {observer: a calibrated prepared program}: the
    first call of an observer keeps its calibration there, and a later one (another kept set) takes its
    observers' statistics from it instead of calibrating again, wherever each observer watches the same tensors
    (observers see float values, so the statistics are the same); where one does not, it calibrates.
    Returns (the fake-quant program, the quantizer, the number of calibration batches)."""
    import copy

    torch = require("torch")
    from torchao.quantization.pt2e import quantize_pt2e

    m = job.model
    q = quantizer_for(observer)
    n_batches = 0
    with quiet_python():
        prepared = quantize_pt2e.prepare_pt2e(copy.deepcopy(module), q)
        known = stats.get(observer) if stats is not None else None
        copied = known is not None and _copy_observers(known[0], prepared)
        if copied:
            n_batches = known[1]
        with torch.no_grad():
            if dynamic:
                prepared(*sample)
            elif not copied:
                assert job.calib is not None  # the pipeline refuses int8 without --calib
                for feed in job.calib.batches(m, limit):
                    prepared(*[torch.from_numpy(np.ascontiguousarray(feed[s.name])) for s in m.inputs])
                    n_batches += 1
        if stats is not None and known is None and not dynamic:
            stats[observer] = (copy.deepcopy(prepared), n_batches)
        converted = quantize_pt2e.convert_pt2e(prepared, fold_quantize=fold)
    if not dynamic and n_batches == 0:
        raise InputSpecError(f"--calib {job.calib.source}: no batch of {m.batch} samples in it")
    return converted, q, n_batches


def torch_run(module, feeds: list[dict[str, np.ndarray]], m) -> list[np.ndarray]:
    """``module`` on every feed, merged as verification merges (edgekit.verify.run_all)."""
    torch = require("torch")
    from edgekit.verify import run_all

    def one(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            o = module(*[torch.from_numpy(np.ascontiguousarray(f[s.name])) for s in m.inputs])
        return [t.detach().numpy() for t in (o if isinstance(o, (tuple, list)) else (o,))]

    return run_all(one, feeds)


def _observer_sites(prepared) -> dict[tuple[str, frozenset[str]], Any]:
    """The observers of a prepared program by (class, the nodes whose values each watches): one observer object
    may sit at several places (a spec shared across a concat), under several names."""
    sites: dict[int, set[str]] = {}
    objs: dict[int, Any] = {}
    for n in prepared.graph.nodes:
        if n.op == "call_module" and "activation_post_process" in str(n.target) and n.args:
            obs = getattr(prepared, n.target)
            objs[id(obs)] = obs
            sites.setdefault(id(obs), set()).add(getattr(n.args[0], "name", str(n.args[0])))
    return {(type(objs[k]).__name__, frozenset(v)): objs[k] for k, v in sites.items()}


def _copy_observers(src, dst) -> bool:
    """``dst``'s observers take the statistics of ``src``'s observers that watch the same nodes (a calibration of
    the same program with other layers kept float); False, and nothing copied, where one of them has no match (a
    kept layer changed what an observer watches: a spec shared across it)."""
    have, want = _observer_sites(src), _observer_sites(dst)
    if not want or any(key not in have for key in want):
        return False
    for key, obs in want.items():
        obs.load_state_dict(have[key].state_dict())
    return True


def observer_outputs(build: Callable[[list[str], str], Any], job: ConvertJob, first: str, ref, search):
    """The mixed search's ``outputs(kept)`` and ``calibration_for(kept)``: ``build(kept, observer)`` is the
    fake-quant program; each kept set is calibrated with every observer and the one closest to float (output SNR)
    is used, unless the user chose the observer (``--option calibration``: then only ``first``, and
    ``calibration_for`` is None). The first build chose its observer all-INT8, where one broken layer can hide the
    difference between the observers; with that layer kept float, they may differ."""
    measure = job.options.get("calibration") in (None, "auto")
    observers = OBSERVERS if measure else (first,)
    m = job.model
    best: dict[tuple[str, ...], str] = {}

    def outputs(kept: list[str]) -> list[np.ndarray]:
        top = None
        for obs in sorted(observers, key=lambda o: o != first):  # the first build's observer wins a tie
            got = torch_run(build(kept, obs), search, m)
            snr = output_snr_db(ref, got)
            if top is None or snr > top[0]:
                top = (snr, obs, got)
        best[tuple(sorted(kept))] = top[1]
        return top[2]

    return outputs, ((lambda kept: best.get(tuple(sorted(kept)))) if measure else None)


def weight_scale_floor_off(cfg):
    """litert-torch's config gives its per-channel weight observer ``eps=2**-12``: no weight scale below 2.4e-4,
    so a row of weights whose largest is under 0.031 loses resolution and one under 1.2e-4 rounds to 0 and +-1.
    Weights that small are common after folding a BatchNorm (a detector head reading a wide feature concat).
    TFLite stores each channel's scale as a float32 and has no such floor: the weights get the observer's own
    default eps (float32's, 1.2e-7)."""
    import dataclasses

    torch = require("torch")
    from torchao.quantization.pt2e import PerChannelMinMaxObserver

    w = cfg.weight
    if w is None or w.qscheme != torch.per_channel_symmetric:
        return cfg
    ctr = PerChannelMinMaxObserver.with_args(eps=torch.finfo(torch.float32).eps)
    return dataclasses.replace(cfg, weight=dataclasses.replace(w, observer_or_fake_quant_ctr=ctr))


def explain_export_failure(exc: Exception, source: str) -> str:
    """What a torch.export / lowering failure means for the user: data-dependent control flow names its fix."""
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:240] if str(exc).strip() else ''}"
    low = str(exc).lower()
    if any(k in low for k in ("data-dependent", "data dependent", "guardonDataDependent".lower(), "could not guard",
                              "dynamic control flow", "unbacked")):
        return (f"{source}: torch.export cannot capture the model: data-dependent control flow ({text}); "
                "rewrite the branch with torch.cond / torch.where, export with fixed input shapes, "
                "or give a .pt2 ExportedProgram saved from a model that exports")
    return f"{source}: litert-torch could not convert the model ({text})"
