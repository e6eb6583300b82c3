"""PT2E quantization of torch input, the steps every PT2E converter takes: the program to quantize (torch.export,
LSTMs written out where asked), the activation observer (chosen by measurement against float), the calibration
on --calib (``prepare_pt2e`` -> calibrate -> ``convert_pt2e``: the fake-quant program, which runs in torch), and
the mixed search's outputs per kept set. Each converter passes its own quantizer (``quantizer_for(observer)``).
torch and torchao are imported inside the functions."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from edgekit.converters.job import ConvertJob
from edgekit.deps import require
from edgekit.errors import ConversionError, InputSpecError
from edgekit.mixed.search import output_snr_db, search_feeds
from edgekit.quiet import quiet_python

CLEAR_FEEDS = 8  # the observer choice measures these search samples first ...
CLEAR_DB = 2.0  # ... and stops there where one observer's output SNR leads by this much
# calibration samples the observer choice measures with; None: every sample, as the build (the full calibration,
# which stops where the ranges converge), so the choice measures the program that is built, and the chosen
# observer's build takes these statistics: nothing is calibrated twice
CHOICE_CALIB: int | None = None
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
    ``found``: gets ``lstms``, the number of LSTMs in the program (written out or not)."""
    torch = require("torch")
    ep = job.model.exported
    if ep is None:
        try:
            ep = torch.export.export(module, sample)
        except Exception as exc:
            raise ConversionError(explain_export_failure(exc, job.model.source)) from None
    lstm = torch.ops.aten.lstm.input
    lstms = sum(1 for n in ep.graph.nodes if n.target == lstm)
    if found is not None:
        found["lstms"] = lstms
    if job.model.exported is not None and not unroll_lstm:
        return module
    if lstms and unroll_lstm:
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
    SNR) on calibration samples, the best taken: on the first :data:`CLEAR_FEEDS` search samples where one
    leads there by :data:`CLEAR_DB`, else on all of them. One pass of statistics serves them all: the histogram
    observers' calibration, whose running min / max are the min-max observers' statistics (:func:`calibrated`
    reuses them, and the chosen observer's full calibration continues from them). A rebuild in the same job (a
    float group, the layer search's kept set without its own measure) takes the first build's choice."""
    asked = job.options.get("calibration") or "auto"
    if asked != "auto":
        return asked, {}
    store = job.cache if isinstance(getattr(job, "cache", None), dict) else {}
    if "observer_chosen" in store:  # a rebuild of this job (a float group, a kept set): the first build's choice
        chosen, measured = store["observer_chosen"]
        job.log(f"activation observer: {chosen}, as this job's first build measured it")
        return chosen, measured
    m = job.model
    search = search_feeds(job)
    # the first CLEAR_FEEDS samples first: where one observer leads by CLEAR_DB there, the rest would not turn it
    head = search[:CLEAR_FEEDS]
    ref = torch_run(module, head, m)
    programs: dict[str, Any] = {}
    got: dict[str, list[np.ndarray]] = {}
    for name in OBSERVERS:
        with job.substep(f"observer ({name})"):
            programs[name], _, _ = calibrated(job, module, sample, name, quantizer_for, limit=CHOICE_CALIB)
            got[name] = torch_run(programs[name], head, m)
    measured = {k: round(output_snr_db(ref, v), 2) for k, v in got.items()}
    ranked = sorted(measured.values(), reverse=True)
    if len(search) > len(head) and not ranked[0] - ranked[-1] >= CLEAR_DB:
        rest = search[len(head):]
        ref = _merge(ref, torch_run(module, rest, m))
        measured = {k: round(output_snr_db(ref, _merge(got[k], torch_run(programs[k], rest, m))), 2)
                    for k in programs}
    else:
        search = head
    if isinstance(getattr(job, "cache", None), dict):  # the built model is measured on them too (simulated vs real)
        job.cache["observer_ref"] = (search, ref)
    chosen = max(measured, key=lambda k: measured[k])
    store["observer_chosen"] = (chosen, measured)
    job.log("activation observer by measurement (output SNR against float on "
            f"{sum(len(next(iter(f.values()))) for f in search)} calibration samples): "
            + ", ".join(f"{k} {v:.1f} dB" for k, v in measured.items()) + f" -> {chosen}")
    return chosen, measured


def _merge(a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
    """Two :func:`torch_run` results (per output, the feeds merged on the batch axis) as one."""
    return [np.concatenate([np.atleast_1d(x), np.atleast_1d(y)]) for x, y in zip(a, b, strict=True)]


def calibrated(job: ConvertJob, module, sample, observer: str, quantizer_for: Callable[[str], Any], *,
               dynamic: bool = False, limit: int | None = None, fold: bool = False,
               stats: dict[str, Any] | None = None):
    """prepare_pt2e -> calibrate on --calib (its first ``limit`` samples: the searches) -> convert_pt2e: the
    fake-quant program (runs in torch), with the quantizer ``quantizer_for(observer)``; ``dynamic``: no
    calibration data (one run of ``sample``). ``fold``: weights as int8 constants (what coremltools reads)
    instead of quantize ops.

    Statistics are calibrated once per job and program (``job.cache``, :func:`_stats_store`; ``stats``: a store
    of the caller's own instead): observers see float values, so a later call (another observer, another kept
    set, a mixed-precision rebuild) takes its observers' statistics from an earlier calibration wherever each
    observer watches the same tensors, instead of calibrating again: the same observer's, else (min-max) the
    histogram observers' running min / max. A full calibration (``limit`` None) continues from the statistics of
    the first ``limit`` samples where those were taken (the observer choice, the search) and stops early where
    another :data:`CONVERGE_CHUNK` samples move no observer's range by more than :data:`CONVERGED_SHARE`; where
    no observer matches (a kept layer changed what one watches: a spec shared across it), it calibrates.
    Returns (the fake-quant program, the quantizer, the number of calibration batches)."""
    import copy
    import itertools

    torch = require("torch")
    from torchao.quantization.pt2e import quantize_pt2e

    m = job.model
    q = quantizer_for(observer)
    n_batches = 0
    store = stats if stats is not None else (None if dynamic else _stats_store(job, module))
    full = limit is None
    with quiet_python():
        prepared = quantize_pt2e.prepare_pt2e(copy.deepcopy(module), q)
        copied, complete = 0, False  # batches whose statistics came from the store; no more to take
        if store is not None and not dynamic:
            own = (lambda obs, lim: store.get(obs)) if stats is not None else (lambda obs, lim: store.get((obs, lim)))
            # a full calibration's statistics first (what the build itself used), else those of the first samples
            # (a full calibration: any first samples' statistics, the most first)
            taken = sorted({k[1] for k in store if isinstance(k, tuple) and k[1] is not None}, reverse=True)
            for lim in [None, *taken] if full else (None, limit):
                sources = [(own(observer, lim), _copy_observers)]
                if observer == "minmax":  # the histogram observers' running min / max
                    sources.append((own("histogram", lim), _minmax_from_histogram))
                hit = next((k for k, fill in sources if k is not None and fill(k[0], prepared)), None)
                if hit is not None:
                    copied = hit[1]
                    complete = not full or lim is None or copied >= _n_batches(job)
                    break
            if not copied and not full and (src := own(observer, limit)) is not None \
                    and (left := _copy_most(src[0], prepared)) is not None:
                # a kept layer changed what a few observers watch: the rest copied, those calibrated on the same
                # samples (every other observer passes values through: the statistics of one calibration)
                with torch.no_grad(), _only_observing(prepared, left):
                    for feed in itertools.islice(job.calib.batches(m, limit), src[1]):
                        prepared(*[torch.from_numpy(np.ascontiguousarray(feed[s.name])) for s in m.inputs])
                copied, complete = src[1], True
        n_batches = copied
        with torch.no_grad():
            if dynamic:
                prepared(*sample)
            elif not complete:
                assert job.calib is not None  # the pipeline refuses int8 without --calib
                last = _ranges(prepared) if full and copied else None
                since = 0
                for feed in itertools.islice(job.calib.batches(m, limit), copied, None):
                    prepared(*[torch.from_numpy(np.ascontiguousarray(feed[s.name])) for s in m.inputs])
                    n_batches += 1
                    since += 1
                    if full and since * m.batch >= CONVERGE_CHUNK and n_batches * m.batch >= MIN_CALIB:
                        now = _ranges(prepared)
                        if last is not None and _moved(last, now) <= CONVERGED_SHARE:
                            job.log(f"calibration statistics converged after {n_batches} batches (the last "
                                    f"{since} moved no observer's range by more than {CONVERGED_SHARE:.1%})")
                            break
                        last, since = now, 0
        if store is not None and not dynamic and n_batches:
            if stats is not None:
                store.setdefault(observer, (copy.deepcopy(prepared), n_batches))
            elif (observer, limit) not in store:
                store[(observer, limit)] = (copy.deepcopy(prepared), n_batches)
        with histogram_ranges_once(), ptq_convert():
            converted = quantize_pt2e.convert_pt2e(prepared, fold_quantize=fold)
    if not dynamic and n_batches == 0:
        raise InputSpecError(f"--calib {job.calib.source}: no batch of {m.batch} samples in it")
    return converted, q, n_batches


@contextmanager
def ptq_convert() -> Iterator[None]:
    """``convert_pt2e`` of a program ``prepare_pt2e`` prepared (post-training quantization), without torchao's
    QAT conv-BatchNorm folding: wherever a BatchNorm node is left (one after a ReLU, which no conv before it
    absorbs), torchao traces its 96 QAT conv-bn patterns with torch.export to match them, a fraction of a second
    each, on every conversion (three per W8A8 build). Those patterns
    are those of ``prepare_qat_pt2e``'s training graph; a program prepared for PTQ never holds one, so the folding
    could only ever find nothing. Its own clean-up (dead code, recompile) still runs."""
    from torchao.quantization.pt2e import quantize_pt2e

    fold = getattr(quantize_pt2e, "_fold_conv_bn_qat", None)  # torchao's private step (torchao is not pinned)
    if fold is None:  # a torchao without it: nothing to skip
        yield
        return

    def nothing_to_fold(m):
        m.graph.eliminate_dead_code()
        m.recompile()
        return m

    quantize_pt2e._fold_conv_bn_qat = nothing_to_fold
    try:
        yield
    finally:
        quantize_pt2e._fold_conv_bn_qat = fold


_RANGES: dict[bytes, tuple[Any, Any]] = {}  # a histogram's statistics -> the range its L2 search chose
_RANGES_MAX = 20000


@contextmanager
def histogram_ranges_once() -> Iterator[None]:
    """torchao's HistogramObserver chooses its range by a search over its histogram when the program is converted
    (about 12 ms per observer: 5 s of each build of a 400-observer program); the builds of an observer choice and
    a mixed-precision search convert observers with the same statistics again and again (copied from one
    calibration, :func:`calibrated`). Within this block each histogram's search runs once: the same statistics
    (histogram, range, bins) give the range computed before, the values torchao's own search gave."""
    import hashlib

    from torchao.quantization.pt2e.observer import HistogramObserver

    search = HistogramObserver.__dict__["_non_linear_param_search"]

    def once(self):
        h = hashlib.sha1()
        for t in (self.histogram, self.min_val, self.max_val):
            h.update(t.detach().contiguous().numpy().tobytes())
        h.update(repr((self.bins, getattr(self, "dst_nbins", None), str(self.histogram.dtype))).encode())
        key = h.digest()
        hit = _RANGES.get(key)
        if hit is None:
            lo, hi = search(self)
            hit = (lo.detach().clone(), hi.detach().clone())
            if len(_RANGES) >= _RANGES_MAX:
                _RANGES.clear()
            _RANGES[key] = hit
        return hit[0].clone(), hit[1].clone()

    HistogramObserver._non_linear_param_search = once
    try:
        yield
    finally:
        HistogramObserver._non_linear_param_search = search


# a full calibration stops where CONVERGE_CHUNK more samples move no activation observer's range (max - min) by
# more than CONVERGED_SHARE of it, after at least MIN_CALIB samples
CONVERGE_CHUNK = 32
CONVERGED_SHARE = 0.005
MIN_CALIB = 96


def _n_batches(job: ConvertJob) -> int:
    return len(job.calib) // max(job.model.batch, 1) if job.calib is not None else 0


def _stats_store(job: ConvertJob, module) -> dict | None:
    """This job's calibrated statistics of ``module`` ({(observer, limit): (prepared program, batches)}), kept in
    ``job.cache`` under the program's fingerprint (its nodes, and its parameters' and buffers' sums: a program
    whose weights were changed, equalized, is another); None where ``module`` has no fx graph."""
    import hashlib
    import itertools

    graph = getattr(module, "graph", None)
    if graph is None:
        return None
    h = hashlib.sha256()
    for n in graph.nodes:
        h.update(f"{n.op}\0{n.name}\0{n.target}\0".encode())
    try:
        for name, t in itertools.chain(module.named_parameters(), module.named_buffers()):
            h.update(f"{name}\0{list(t.shape)}\0{float(t.detach().double().sum()) if t.is_floating_point() else 0}"
                     .encode())
    except (AttributeError, RuntimeError, TypeError):  # a module without plain tensors: no reuse
        return None
    return job.cache.setdefault("pt2e_stats", {}).setdefault(h.hexdigest(), {})


def _activation_observers(prepared) -> list[Any]:
    return [getattr(prepared, n.target) for n in prepared.graph.nodes
            if n.op == "call_module" and "activation_post_process" in str(n.target)]


def _ranges(prepared) -> dict[int, tuple[float, float]]:
    out = {}
    for obs in _activation_observers(prepared):
        lo, hi = getattr(obs, "min_val", None), getattr(obs, "max_val", None)
        if lo is not None and hi is not None and lo.numel() == 1 and hi.numel() == 1:
            out[id(obs)] = (float(lo), float(hi))
    return out


def _moved(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]) -> float:
    """The largest move of an observer's min or max between two snapshots, as a share of its range."""
    worst = 0.0
    for k, (lo, hi) in after.items():
        if k not in before or not np.isfinite(lo) or not np.isfinite(hi):
            return float("inf")
        blo, bhi = before[k]
        if not np.isfinite(blo) or not np.isfinite(bhi):
            return float("inf")
        span = max(hi - lo, 1e-12)
        worst = max(worst, abs(lo - blo) / span, abs(hi - bhi) / span)
    return worst


def _minmax_from_histogram(src, dst) -> bool:
    """``dst``'s MinMaxObservers take the running min / max of ``src``'s HistogramObservers watching the same
    nodes (a HistogramObserver's min_val / max_val are the exact observed range), its other observers (weights)
    the statistics of ``src``'s of the same class; False, and nothing copied, where one has no match."""
    have = {nodes: obs for (_, nodes), obs in _observer_sites(src).items()}
    have_cls = _observer_sites(src)
    want = _observer_sites(dst)
    plan = []
    for (cls, nodes), obs in want.items():
        if cls == "MinMaxObserver" and type(have.get(nodes)).__name__ == "HistogramObserver":
            plan.append((obs, have[nodes], True))
        elif (cls, nodes) in have_cls:
            plan.append((obs, have_cls[(cls, nodes)], False))
        else:
            return False
    if not plan:
        return False
    for _, src_obs, minmax in plan:
        if minmax and not (np.isfinite(float(src_obs.min_val)) and np.isfinite(float(src_obs.max_val))):
            return False
    for obs, src_obs, minmax in plan:
        if minmax:
            obs.min_val.resize_(src_obs.min_val.shape).copy_(src_obs.min_val)
            obs.max_val.resize_(src_obs.max_val.shape).copy_(src_obs.max_val)
        else:
            obs.load_state_dict(src_obs.state_dict())
    return True


def torch_run(module, feeds: list[dict[str, np.ndarray]], m) -> list[np.ndarray]:
    """``module`` on every feed, merged as verification merges (edgekit.verify.run_all); a fake-quant program runs
    as :func:`fused_fake_quant` makes it (the same values, in a fraction of the time)."""
    torch = require("torch")
    from edgekit.verify import run_all

    module = fused_fake_quant(module)

    def one(f: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            o = module(*[torch.from_numpy(np.ascontiguousarray(f[s.name])) for s in m.inputs])
        return [t.detach().numpy() for t in (o if isinstance(o, (tuple, list)) else (o,))]

    return run_all(one, feeds)


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # program -> its fused_fake_quant copy


def fused_fake_quant(module):
    """A fake-quant program (convert_pt2e's, weights not folded) made fast to run in torch, computing the same
    values: each activation's quantize -> dequantize pair (torchao's decomposed ops, several tensor ops each) one
    ``aten.fake_quantize_per_tensor_affine``, and each constant weight's quantize -> dequantize computed once into
    a float constant. A copy, made once per program; ``module`` itself where it has no such pair."""
    fast = _FUSED.get(module)
    if fast is not None:
        return fast
    graph = getattr(module, "graph", None)
    if graph is None:
        return module
    import copy

    torch = require("torch")
    ops = getattr(torch.ops, "quantized_decomposed", None)
    try:
        q_t, dq_t = ops.quantize_per_tensor.default, ops.dequantize_per_tensor.default
        q_c, dq_c = ops.quantize_per_channel.default, ops.dequantize_per_channel.default
    except AttributeError:  # torchao's ops not registered: nothing here is a fake-quant program
        return module
    if not any(n.target in (dq_t, dq_c) for n in graph.nodes):
        return module
    fast = copy.deepcopy(module)
    g = fast.graph
    folded = 0

    def attr(node):
        obj = fast
        for part in str(node.target).split("."):
            obj = getattr(obj, part)
        return obj

    def const(a) -> bool:
        return not isinstance(a, torch.fx.Node) or a.op == "get_attr"

    for dq in list(g.nodes):
        if dq.op != "call_function" or dq.target not in (dq_t, dq_c) or dq.kwargs.get("out_dtype") is not None:
            continue
        q = dq.args[0]
        if not isinstance(q, torch.fx.Node) or q.target is not (q_t if dq.target is dq_t else q_c):
            continue
        if tuple(q.args[1:]) != tuple(dq.args[1:len(q.args)]):
            continue
        if all(const(a) for a in q.args) and all(const(a) for a in dq.args[1:]):  # a constant (weight): fold it
            vals = [attr(a) if isinstance(a, torch.fx.Node) else a for a in q.args]
            with torch.no_grad():
                w = dq.target(q.target(*vals), *vals[1:])
            name = f"_edgekit_folded_{folded}"
            folded += 1
            fast.register_buffer(name, w)
            with g.inserting_before(dq):
                new = g.get_attr(name)
        elif dq.target is dq_t and isinstance(q.args[1], float) and isinstance(q.args[2], int) \
                and q.args[5] in (torch.int8, torch.uint8):
            with g.inserting_before(dq):
                new = g.call_function(torch.ops.aten.fake_quantize_per_tensor_affine.default,
                                      (q.args[0], q.args[1], q.args[2], q.args[3], q.args[4]))
        else:
            continue
        new.meta = dict(dq.meta)
        dq.replace_all_uses_with(new)
        g.erase_node(dq)
    g.eliminate_dead_code()
    fast.recompile()
    _FUSED[module] = fast
    return fast


def _watched(node) -> str:
    """The node whose values an observer's argument carries: an observer placed on another observer's output
    (a consumer's input spec unlike its producer's output spec) is named by the node at the chain's start and its
    place in the chain; observer nodes are numbered in graph order, which a kept layer changes."""
    depth = 0
    while getattr(node, "op", None) == "call_module" and "activation_post_process" in str(node.target) and node.args:
        node, depth = node.args[0], depth + 1
    name = getattr(node, "name", str(node))
    return name if depth == 0 else f"{name}~{depth}"


def _observer_sites(prepared) -> dict[tuple[str, frozenset[str]], Any]:
    """The observers of a prepared program by (class, the nodes whose values each watches): one observer object
    may sit at several places (a spec shared across a concat), under several names."""
    sites: dict[int, set[str]] = {}
    objs: dict[int, Any] = {}
    for n in prepared.graph.nodes:
        if n.op == "call_module" and "activation_post_process" in str(n.target) and n.args:
            obs = getattr(prepared, n.target)
            objs[id(obs)] = obs
            sites.setdefault(id(obs), set()).add(_watched(n.args[0]))
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


# at most this share of a program's observers without a match: the rest are copied and only these calibrated
PARTIAL_SHARE = 0.1


def _copy_most(src, dst) -> list[Any] | None:
    """Where most of ``dst``'s observers (all but :data:`PARTIAL_SHARE`) have a match in ``src``: their statistics
    copied (:func:`_copy_observers`), and the observers left to calibrate returned (a kept layer split a shared
    spec, or changed what its neighbours watch); None, and nothing copied, where more have none."""
    have, want = _observer_sites(src), _observer_sites(dst)
    left = [obs for key, obs in want.items() if key not in have]
    if not want or len(left) > PARTIAL_SHARE * len(want):
        return None
    for key, obs in want.items():
        if key in have:
            obs.load_state_dict(have[key].state_dict())
    return left


@contextmanager
def _only_observing(prepared, observers: list[Any]) -> Iterator[None]:
    """Within the block, the prepared program's observers other than ``observers`` pass values through untouched
    (their statistics, copied, stay as they are)."""
    keep = {id(o) for o in observers}
    muted = [o for o in _activation_observers(prepared) if id(o) not in keep]
    for o in muted:
        o.forward = _identity
    try:
        yield
    finally:
        for o in muted:
            o.__dict__.pop("forward", None)


def _identity(x):
    return x


def observer_outputs(build: Callable[[list[str], str], Any], job: ConvertJob, first: str, ref, search,
                     skip: tuple[str, ...] = ()):
    """The mixed search's ``outputs(kept)`` and ``calibration_for(kept)``: ``build(kept, observer)`` is the
    fake-quant program; each kept set is calibrated with every observer and the one closest to float (output SNR)
    is used, unless the user chose the observer (``--option calibration``: then only ``first``, and
    ``calibration_for`` is None). The first build chose its observer all-INT8, where one broken layer can hide the
    difference between the observers; with that layer kept float, they may differ. A single layer kept alone (the
    sensitivity scan: most of the search's builds) is measured with ``first`` only: the scan ranks layers by what
    keeping each gains, and the all-INT8 set it is compared with was measured with every observer. Observers in
    ``skip`` (their build did not lower) are not measured."""
    measure = job.options.get("calibration") in (None, "auto")
    observers = tuple(o for o in OBSERVERS if o not in skip or o == first) if measure else (first,)
    m = job.model
    best: dict[tuple[str, ...], str] = {}

    def outputs(kept: list[str]) -> list[np.ndarray]:
        top = None
        for obs in sorted(observers if len(kept) != 1 else (first,), key=lambda o: o != first):  # first wins a tie
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
