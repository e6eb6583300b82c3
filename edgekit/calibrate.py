"""Recalibration: fit a board's cost-model constants to measured latency.

``calibrate`` (host board) builds the digits example and torch micro-benchmarks, one per
op class the cost model tells apart (dense conv stack, batch-1 GEMM stack, depthwise-separable
blocks at two sizes, pointwise conv stack, inverted-residual blocks), at each precision with
the real pipeline, times each with onnxruntime on this CPU (the ``host/host`` board's runtime,
with the session settings of the bundle's runner), and stores each measurement beside the cost
model's per-layer terms (:func:`edgekit.costmodel.layer_terms`). Smoke results from real boards
(:func:`edgekit.results.measurements`) join the fit when the same model and precision already
have stored per-layer terms, else as one whole-model term.

The fit: latency = sum over layers of
``max(compute_eff1 / (efficiency[precision] x class_efficiency[class]), memory / bandwidth_factor)
+ launches x launch_overhead x (1 + passes[precision]) + passes[precision] x pass / bandwidth_factor``
(the cost model's own formula, see :mod:`edgekit.costmodel`), minimising the mean
|log(estimate / measured)| over the samples with scipy's Powell search in log space; a weak pull
towards the profile's values keeps a constant the samples cannot pin down (a precision or an op
class that was not measured) where the profile put it. Timing takes the lowest of several
rounds' medians: on a shared machine other processes only ever add time. The result is
written to ``<data dir>/calibration/<vendor>__<board>.json`` (data dir: ``$EDGEKIT_DATA_DIR``,
else platformdirs' user data dir) and applied by :func:`edgekit.costmodel.calibrated`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.calibration_store import load_store, save_store
from edgekit.costmodel import latency_ms
from edgekit.fsutil import work_dir

# A fitted efficiency above 1 means the profile's peak is too low for this machine (e.g. a
# newer CPU than the profile describes); the fit allows that rather than hide it.
MAX_EFFICIENCY = 8.0
PRIOR_WEIGHT = 0.002  # pull of the profile's values, per squared log-unit, against mean |log error|
# (factory, input shape): one micro-benchmark per op class the cost model tells apart
MICRO_BENCHMARKS = [("conv_bench", "1,16,32,32"), ("gemm_bench", "1,512"), ("dw_bench", "1,32,32,32"),
                    ("dw_bench", "1,32,64,64"), ("pw_bench", "1,32,32,32"), ("ir_bench", "1,3,48,48")]


# ---------------------------------------------------------------- micro-benchmarks (torch factories)


def conv_bench():
    torch = __import__("torch")
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, 10))


def gemm_bench():
    torch = __import__("torch")
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def dw_bench():
    """Depthwise-separable blocks (MobileNet-style): many small, memory-bound layers."""
    torch = __import__("torch")
    nn = torch.nn
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(4):
        layers += [nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU6(), nn.Conv2d(32, 32, 1), nn.ReLU6()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def pw_bench():
    """Pointwise (1x1) convolutions: dense compute on large activations."""
    torch = __import__("torch")
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(32, 128, 1), nn.ReLU(), nn.Conv2d(128, 128, 1), nn.ReLU(), nn.Conv2d(128, 32, 1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def ir_bench():
    """Two inverted-residual blocks (1x1 expand x6, 3x3 depthwise, 1x1 project, residual add):
    the mix of pointwise, depthwise and elementwise work of mobile CNNs, at one small size."""
    torch = __import__("torch")
    nn = torch.nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c: int = 24, t: int = 6) -> None:
            super().__init__()
            h = c * t
            self.f = nn.Sequential(nn.Conv2d(c, h, 1), nn.ReLU6(), nn.Conv2d(h, h, 3, 1, 1, groups=h), nn.ReLU6(),
                                   nn.Conv2d(h, c, 1))

        def forward(self, x):
            return x + self.f(x)

    return nn.Sequential(nn.Conv2d(3, 24, 3, 1, 1), nn.ReLU6(), Block(), Block(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(24, 10))


def default_models() -> list[tuple[str, list[str] | None, str | None]]:
    """(model, input_shape, calib) triples: the digits example and the micro-benchmarks."""
    out: list[tuple[str, list[str] | None, str | None]] = []
    digits = Path(__file__).resolve().parents[1] / "examples" / "digits"  # a source checkout
    if (digits / "digits_cnn.pt2").exists():
        out.append((str(digits / "digits_cnn.pt2"), None, str(digits / "calib.npz")))
    for name, shape in MICRO_BENCHMARKS:
        out.append((f"edgekit.calibrate:{name}", [shape], "random"))
    return out


# ---------------------------------------------------------------- measuring


def time_onnx(paths: list[Path], feeds: list[dict[str, np.ndarray]], iterations: int, rounds: int = 7,
              log: Callable[[str], None] = lambda m: None) -> list[float]:
    """Latency (ms) of one run of each model in the bundle runner's onnxruntime session.

    The models are timed in turn, ``rounds`` times over (``iterations`` runs each in all), and
    each keeps the lowest of its round medians: on a shared machine other processes only ever
    add time, and taking turns spreads a burst of someone else's work over every model instead
    of landing on one.
    """
    from edgekit.converters import load_firmware
    from edgekit.deps import require

    require("onnxruntime", "jetson")
    runner = load_firmware("tensorrt")
    models = [runner.OnnxRuntimeModel(str(p)) for p in paths]
    per_round = max(3, iterations // rounds)
    best = [float("inf")] * len(models)
    for r in range(rounds):
        for i, (model, f) in enumerate(zip(models, feeds)):
            for _ in range(2):  # warm the caches after the other models ran
                model(f)
            times = []
            for _ in range(per_round):
                t0 = time.perf_counter()
                model(f)
                times.append(time.perf_counter() - t0)
            best[i] = min(best[i], float(np.median(times)) * 1e3)
        log(f"timing round {r + 1}/{rounds}")
    return best


def sample_terms(stats, board, precision: str) -> dict[str, Any]:
    """A sample's record of the cost model's per-layer terms (what the fit scales) and its current estimate."""
    from edgekit.costmodel import Candidate, estimate, layer_terms

    cand = Candidate(precision, board.default_power_mode)
    ts = layer_terms(stats, board, cand)
    return {"terms": {"class": [t.op_class for t in ts], "compute_ms_eff1": [t.compute_ms_eff1 for t in ts],
                      "memory_ms": [t.memory_ms for t in ts], "pass_ms": [t.pass_ms for t in ts],
                      "launches": [t.launches for t in ts]},
            "layers": sum(t.launches for t in ts), "ops": [t.op for t in ts],
            "estimated_latency_ms": estimate(stats, board, cand).latency_ms}


def measure(board_id: str = "host/host", models: list[tuple[str, list[str] | None, str | None]] | None = None,
            precisions: list[str] | None = None, iterations: int = 50,
            log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """Build each model at each precision with the pipeline, then time them all with onnxruntime on this CPU."""
    from edgekit.pipeline import convert
    from edgekit.profiles import load_board

    board = load_board(board_id)
    target = board.targets[0]
    precisions = precisions or [p for p in ("fp32", "fp16", "int8") if p in board.precisions]
    samples, paths, feeds = [], [], []
    models = models or default_models()
    with work_dir("edgekit-calib-") as tmp:
        for i, (model, shape, calib) in enumerate(models):
            for prec in precisions:
                out = Path(tmp) / f"m{i}-{prec}"
                res = convert(model, target=target, out=out, board=board.id, precision=prec,
                              calib=calib if prec == "int8" else None, input_shape=shape, golden_count=4)
                feeds.append(_first_feed(res))
                paths.append(res.out_dir / res.manifest["artifact"]["primary"])
                tag = f"@{shape[0]}" if shape else ""
                samples.append({"model": str(model) + (f" {tag}" if tag else ""),
                                "model_sha256": res.manifest["source_model"]["sha256"] + tag,
                                "precision": prec, "source": "calibrate", **sample_terms(res.stats, board, prec)})
                log(f"built [{len(samples)}/{len(models) * len(precisions)}] {Path(str(model)).name} {tag} {prec}")
        times = time_onnx(paths, feeds, iterations, log=log)
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for s, ms in zip(samples, times):
        s.update(measured_latency_ms=ms, at_utc=at)
        log(f"{Path(s['model']).name} {s['precision']}: measured {ms:.4f} ms, "
            f"estimated {s['estimated_latency_ms']:.4f} ms")
    return samples


def _first_feed(res) -> dict[str, np.ndarray]:
    """The first golden sample of a build (the pipeline's ConvertResult), as one feed."""
    with np.load(res.out_dir / res.manifest["golden"]["file"]) as z:
        return {g["name"]: np.asarray(z[g["key"]][:1]) for g in res.manifest["golden"]["inputs"]}


# ---------------------------------------------------------------- fitting


def constants(board) -> dict[str, Any]:
    """The cost-model constants a board's profile (or its applied calibration) carries."""
    return {"efficiency": dict(board.efficiency), "class_efficiency": dict(board.class_efficiency),
            "activation_passes": dict(board.activation_passes), "launch_overhead_us": board.launch_overhead_us,
            "bandwidth_factor": 1.0}


def _usable(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in samples if "terms" in s and s.get("measured_latency_ms")]  # older stores lack terms


def predict(sample: dict[str, Any], consts: dict[str, Any], default_eff: float = 0.25) -> float:
    """The cost model's latency (ms) for one stored sample under ``consts`` (see :func:`constants`)."""
    t = sample["terms"]
    prec = sample["precision"]
    ce = consts.get("class_efficiency", {})
    eff = consts["efficiency"].get(prec, default_eff) * np.array([ce.get(c, 1.0) for c in t["class"]])
    bwf = consts.get("bandwidth_factor", 1.0)
    passes = consts.get("activation_passes", {}).get(prec, 0.0)
    return latency_ms(np.asarray(t["compute_ms_eff1"], dtype=float) / eff,
                      np.asarray(t["memory_ms"], dtype=float) / bwf,
                      np.asarray(t["launches"], dtype=float) * consts["launch_overhead_us"] / 1e3 * (1 + passes),
                      passes * np.asarray(t["pass_ms"], dtype=float) / bwf)


def fit(samples: list[dict[str, Any]], start: dict[str, Any]) -> dict[str, Any]:
    """Constants minimising mean |log(estimate / measured)| (+ a weak pull towards ``start``).

    Every constant the samples can inform moves; with whole-model samples only (no per-layer
    terms) that is the efficiency alone. A precision / op class that no sample has stays at ``start``.
    """
    from edgekit.deps import require

    optimize = require("scipy.optimize", "plan")
    samples = _usable(samples)
    if not samples:
        raise ValueError("no samples to fit")
    layered = any(np.sum(s["terms"]["launches"]) for s in samples)
    free = ({"efficiency", "class_efficiency", "activation_passes", "launch_overhead_us", "bandwidth_factor"}
            if layered else {"efficiency"})
    precs = sorted({s["precision"] for s in samples})
    # an op class is fitted only where it carries a real share of some sample's compute
    classes = sorted({c for s in samples for c in ("dwconv", "gemm")
                      if _class_share(s, c) > 0.05})
    keys: list[tuple[str, str | None]] = []
    keys += [("efficiency", p) for p in precs if "efficiency" in free]
    keys += [("activation_passes", p) for p in precs if "activation_passes" in free]
    keys += [("class_efficiency", c) for c in classes if "class_efficiency" in free]
    keys += [(k, None) for k in ("launch_overhead_us", "bandwidth_factor") if k in free]
    defaults = {"efficiency": 0.25, "activation_passes": 0.0, "class_efficiency": 1.0}

    def get(c: dict[str, Any], k: str, sub: str | None) -> float:
        return float(c[k] if sub is None else c.get(k, {}).get(sub, defaults[k]))

    # passes and launch may be 0: fitted as log(x + floor)
    floor = {"activation_passes": 1.0, "launch_overhead_us": 1.0}
    x0 = np.array([np.log(get(start, k, sub) + floor.get(k, 0.0)) for k, sub in keys])
    bounds = {"efficiency": (1e-4, MAX_EFFICIENCY), "activation_passes": (0.0, 20.0), "class_efficiency": (1e-3, 4.0),
              "launch_overhead_us": (0.0, 1000.0), "bandwidth_factor": (0.05, 50.0)}

    def unpack(x: np.ndarray) -> dict[str, Any]:
        c = copy.deepcopy(start)
        for (k, sub), v in zip(keys, x):
            lo, hi = bounds[k]
            val = float(np.clip(np.exp(v) - floor.get(k, 0.0), lo, hi))
            if sub is None:
                c[k] = val
            else:
                c.setdefault(k, {})[sub] = val
        return c

    measured = np.array([s["measured_latency_ms"] for s in samples])

    def loss(x: np.ndarray) -> float:
        c = unpack(x)
        pred = np.array([predict(s, c) for s in samples])
        return float(np.mean(np.abs(np.log(pred / measured))) + PRIOR_WEIGHT * np.sum((x - x0) ** 2))

    best = None
    for seed in range(3):  # a few starts: the max() in the model makes the surface piecewise
        xs = x0 if seed == 0 else x0 + np.random.default_rng(seed).normal(0, 0.5, len(x0))
        r = optimize.minimize(loss, xs, method="Powell", options={"maxiter": 20000, "xtol": 1e-4, "ftol": 1e-7})
        if best is None or r.fun < best.fun:
            best = r
    out = unpack(best.x)
    out["samples"] = len(samples)
    out["fitted"] = sorted(f"{k}.{sub}" if sub else k for k, sub in keys)
    out["fitted_utc"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def _class_share(sample: dict[str, Any], cls: str) -> float:
    t = sample["terms"]
    total = sum(t["compute_ms_eff1"]) or 1.0
    return sum(ms for c, ms in zip(t["class"], t["compute_ms_eff1"]) if c == cls) / total


def median_abs_error(samples: list[dict[str, Any]], consts: dict[str, Any]) -> float:
    """Median of |estimate - measured| / measured over the samples."""
    errs = [abs(predict(s, consts) - s["measured_latency_ms"]) / s["measured_latency_ms"] for s in _usable(samples)]
    return float(np.median(errs)) if errs else float("nan")


def results_samples(board, known: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Smoke measurements from the results store (edgekit.results.measurements).

    Where per-layer terms of that model and precision are stored, the measurement uses them;
    otherwise the build's own estimate (manifest ``plan.estimate``) stands in as one
    compute-bound term at the efficiency the estimate was made with, so the fit scales it.
    """
    try:
        from edgekit import results
    except ImportError:
        return []
    from edgekit.costmodel import calibrated, efficiency

    current = calibrated(board)
    terms = {(s["model_sha256"], s["precision"]): s for s in known}
    out = []
    for row in results.measurements(board.id):
        measured = row.get("measured_latency_ms")
        if not measured or not row.get("precision"):
            continue
        base = terms.get((row.get("model_sha256"), row.get("precision")))
        if base is None:
            est = row.get("estimated_latency_ms")
            if not est:
                continue
            base = {"model": row.get("model_sha256"), "model_sha256": row.get("model_sha256"),
                    "precision": row["precision"],
                    "terms": {"class": ["conv"], "compute_ms_eff1": [est * efficiency(current, row["precision"])],
                              "memory_ms": [0.0], "pass_ms": [0.0], "launches": [0]},
                    "layers": 0, "ops": ["(whole model)"], "estimated_latency_ms": est}
        out.append({**base, "measured_latency_ms": float(measured), "source": "results-store",
                    "at_utc": row.get("measured_at")})
    return out


def calibrate(board_id: str = "host/host", iterations: int = 50, models=None, precisions=None,
              measure_here: bool | None = None, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Measure (host board), merge stored and results-store samples, fit, store. Returns the store."""
    from edgekit.errors import ProfileError
    from edgekit.profiles import load_board

    board = load_board(board_id)
    store = load_store(board.id)
    here = board.id == "host/host" if measure_here is None else measure_here
    new = measure(board.id, models, precisions, iterations, log) if here else []
    # keep older samples of other (model, precision) pairs; a new measurement replaces the old one
    keys = {(s["model_sha256"], s["precision"]) for s in new}
    samples = [s for s in store["samples"] if (s["model_sha256"], s["precision"]) not in keys] + new
    extra = results_samples(board, samples)
    all_samples = samples + extra
    if not all_samples:
        raise ProfileError(
            f"no measurements for board {board.id}: run a smoke test on it first (`edgekit smoke`), "
            "or calibrate the host board (`edgekit calibrate --board host`)"
        )
    start = constants(board)
    before = median_abs_error(all_samples, start)
    f = fit(all_samples, start)  # whole-model samples only: efficiency alone moves, nothing pins the rest
    f["median_abs_error_before"] = before
    f["median_abs_error_after"] = median_abs_error(all_samples, f)
    f["results_store_samples"] = len(extra)
    store = {"board": board.id, "samples": samples, "fit": f}
    save_store(board.id, store)
    return store
