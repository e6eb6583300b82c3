"""Recalibration: fit a board's efficiency factors and launch overhead to measured latency.

``calibrate_host`` builds a few models (the digits example and torch micro-benchmarks:
a conv stack and a GEMM stack) at each precision with the real pipeline, times them with
onnxruntime on this CPU (the ``host/host`` board's runtime), and stores each measurement
beside the cost model's per-layer terms. Smoke results from real boards
(:func:`edgekit.results.measurements`) join the fit when the same model and precision
already have stored per-layer terms.

The fit: latency = sum over layers max(compute_at_efficiency_1 / efficiency[precision],
memory / bandwidth_factor) + layers x launch_overhead; grid search over launch overhead and
bandwidth factor (caches make small models beat DRAM bandwidth), and for each precision
over efficiency, minimising the mean absolute log error. The result is written
to ``<data dir>/calibration/<vendor>__<board>.json`` (data dir: ``$EDGEKIT_DATA_DIR``, else
platformdirs' user data dir) and applied by :func:`edgekit.costmodel.calibrated`.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.fsutil import atomic_write_bytes, data_root  # shared with edgekit.results

# A fitted efficiency above 1 means the profile's peak is too low for this machine (e.g. a
# newer CPU than the profile describes); the fit allows that rather than hide it.
MAX_EFFICIENCY = 8.0
MICRO_SHAPES = {"conv_bench": "1,16,32,32", "gemm_bench": "1,512", "dw_bench": "1,32,32,32"}


def store_path(board_id: str) -> Path:
    return data_root() / "calibration" / (board_id.replace("/", "__") + ".json")


def load_store(board_id: str) -> dict[str, Any]:
    p = store_path(board_id)
    if not p.exists():
        return {"board": board_id, "samples": [], "fit": None}
    return json.loads(p.read_text())


def save_store(board_id: str, data: dict[str, Any]) -> Path:
    p = store_path(board_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(p, (json.dumps(data, indent=1) + "\n").encode())
    return p


def load_fit(board_id: str) -> dict[str, Any] | None:
    p = store_path(board_id)
    if not p.exists():
        return None
    return json.loads(p.read_text()).get("fit")


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


def default_models() -> list[tuple[str, list[str] | None, str | None]]:
    """(model, input_shape, calib) triples: the digits example and the micro-benchmarks."""
    out: list[tuple[str, list[str] | None, str | None]] = []
    digits = Path(__file__).resolve().parents[1] / "examples" / "digits"  # a source checkout
    if (digits / "digits_cnn.pt2").exists():
        out.append((str(digits / "digits_cnn.pt2"), None, str(digits / "calib.npz")))
    for name, shape in MICRO_SHAPES.items():
        out.append((f"edgekit.calibrate:{name}", [shape], "random"))
    return out


# ---------------------------------------------------------------- measuring


def time_onnx(path: Path, feeds: dict[str, np.ndarray], iterations: int, warmup: int = 5) -> float:
    """Median latency (ms) of one onnxruntime CPU session run."""
    from edgekit.deps import require

    ort = require("onnxruntime", "jetson")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def layer_terms(stats, board, precision: str) -> dict[str, Any]:
    """Per-layer compute time at efficiency 1 and memory time (ms): what the fit scales."""
    from edgekit.costmodel import FUSED_OPS, Candidate, efficiency, estimate

    est = estimate(stats, board, Candidate(precision, board.default_power_mode))
    eff = efficiency(board, precision)
    return {"compute_ms_eff1": [lc.compute_ms * eff for lc in est.layers],
            "memory_ms": [lc.memory_ms for lc in est.layers], "layers": sum(1 for lc in est.layers if lc.op not in FUSED_OPS),
            "ops": [lc.op for lc in est.layers],
            "estimated_latency_ms": est.latency_ms}


def measure(board_id: str = "host/host", models: list[tuple[str, list[str] | None, str | None]] | None = None,
            precisions: list[str] | None = None, iterations: int = 50,
            log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """Build each model at each precision with the pipeline and time it with onnxruntime on this CPU."""
    from edgekit.pipeline import convert
    from edgekit.profiles import load_board

    board = load_board(board_id)
    target = board.targets[0]
    precisions = precisions or [p for p in ("fp32", "fp16", "int8") if p in board.precisions]
    samples = []
    with tempfile.TemporaryDirectory(prefix="edgekit-calib-") as tmp:
        for i, (model, shape, calib) in enumerate(models or default_models()):
            for prec in precisions:
                out = Path(tmp) / f"m{i}-{prec}"
                res = convert(model, target=target, out=out, board=board.id, precision=prec,
                              calib=calib if prec == "int8" else None, input_shape=shape, golden_count=4)
                feeds = {k: np.asarray(v) for k, v in _first_feed(res.out_dir).items()}
                ms = time_onnx(res.out_dir / res.manifest["artifact"]["primary"], feeds, iterations)
                terms = layer_terms(res.stats, board, prec)
                samples.append({"model": str(model), "model_sha256": res.manifest["source_model"]["sha256"],
                                "precision": prec, "measured_latency_ms": ms, "source": "calibrate",
                                "at_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), **terms})
                log(f"{Path(str(model)).name} {prec}: measured {ms:.4f} ms, estimated {terms['estimated_latency_ms']:.4f} ms")
    return samples


def _first_feed(out_dir: Path) -> dict[str, np.ndarray]:
    man = json.loads((out_dir / "manifest.json").read_text())
    with np.load(out_dir / "golden.npz") as z:
        return {g["name"]: z[g["key"]][:1] for g in man["golden"]["inputs"]}


# ---------------------------------------------------------------- fitting


def predict(sample: dict[str, Any], eff: float, launch_us: float, bw_factor: float = 1.0) -> float:
    c = np.asarray(sample["compute_ms_eff1"]) / eff
    m = np.asarray(sample["memory_ms"]) / bw_factor
    return float(np.maximum(c, m).sum() + sample["layers"] * launch_us / 1e3)


def fit(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Efficiency per precision and one launch overhead, minimising mean |log(estimate / measured)|."""
    if not samples:
        raise ValueError("no samples to fit")
    launches = np.linspace(0, 300, 301)  # us
    effs = np.logspace(-4, np.log10(MAX_EFFICIENCY), 181)
    bws = np.logspace(-1, 1.5, 26)  # effective bandwidth / profile bandwidth (caches make it > 1)
    precs = sorted({s["precision"] for s in samples})
    total = np.zeros((len(bws), len(launches)))
    best_eff: dict[str, np.ndarray] = {}
    for p in precs:
        err = np.zeros((len(effs), len(bws), len(launches)))
        for s in (s for s in samples if s["precision"] == p):
            c = np.asarray(s["compute_ms_eff1"], dtype=float)
            m = np.asarray(s["memory_ms"], dtype=float)
            base = np.maximum(c[None, None, :] / effs[:, None, None], m[None, None, :] / bws[None, :, None]).sum(-1)
            pred = base[:, :, None] + s["layers"] * launches[None, None, :] / 1e3
            err += np.abs(np.log(pred / s["measured_latency_ms"]))
        best_eff[p] = np.argmin(err, axis=0)  # best efficiency index per (bandwidth, launch)
        total += err.min(axis=0)
    i, k = np.unravel_index(int(np.argmin(total)), total.shape)
    return {"efficiency": {p: float(effs[best_eff[p][i, k]]) for p in precs},
            "bandwidth_factor": float(bws[i]), "launch_overhead_us": float(launches[k]), "samples": len(samples),
            "fitted_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def median_abs_error(samples: list[dict[str, Any]], eff: dict[str, float], launch_us: float,
                     bw_factor: float = 1.0, default_eff: float = 0.25) -> float:
    """Median of |estimate - measured| / measured over the samples."""
    errs = [abs(predict(s, eff.get(s["precision"], default_eff), launch_us, bw_factor) - s["measured_latency_ms"])
            / s["measured_latency_ms"] for s in samples]
    return float(np.median(errs))


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
                    "precision": row["precision"], "compute_ms_eff1": [est * efficiency(current, row["precision"])],
                    "memory_ms": [0.0], "layers": 0, "ops": ["(whole model)"], "estimated_latency_ms": est}
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
    before = median_abs_error(all_samples, dict(board.efficiency), board.launch_overhead_us)
    f = fit(all_samples)
    if not any(s["layers"] for s in all_samples):  # whole-model estimates only: nothing pins these down
        f["launch_overhead_us"], f["bandwidth_factor"] = board.launch_overhead_us, 1.0
    f["median_abs_error_before"] = before
    f["median_abs_error_after"] = median_abs_error(all_samples, f["efficiency"], f["launch_overhead_us"],
                                                   f["bandwidth_factor"])
    f["results_store_samples"] = len(extra)
    store = {"board": board.id, "samples": samples, "fit": f}
    save_store(board.id, store)
    return store
