"""LiteRT on this host: the interpreter (XNNPACK), whether TFLite's builtin kernels load a model, which node
fails to prepare, and the median latency."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path

import numpy as np

from edgekit.converters.tflite.options import EXTRA
from edgekit.deps import require
from edgekit.errors import ConversionError
from edgekit.tflite_graph import TFLiteGraph

LATENCY_BUDGET_S = 2.0  # wall time the build's host latency may take per thread count (the speed stage times it again)


def builtin_refusal(path: Path) -> str | None:
    """Why TFLite's builtin kernels (no XNNPACK) refuse to prepare the model, e.g. an int8 LOGISTIC whose output
    scale is not 1/256; None where they load it."""
    litert = require("ai_edge_litert.interpreter", EXTRA)
    try:
        litert.Interpreter(model_path=str(path),
                           experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                           ).allocate_tensors()
    except (RuntimeError, ValueError) as exc:
        return str(exc).strip().splitlines()[0][:240] if str(exc).strip() else type(exc).__name__
    return None


def refused_node(path: Path) -> tuple[str, str, str] | None:
    """(op, its output tensor's name, LiteRT's reason) where the .tflite fails to load in LiteRT because one node
    failed to prepare; None where it loads. Any other load failure raises as it is."""
    try:
        interpreter(path, 1)
        return None
    except (RuntimeError, ValueError) as exc:
        found = re.search(r"(?s)(.*?)Node number (\d+) \((\w+)\) failed to prepare", str(exc))
        if not found:
            raise ConversionError(f"{path.name} does not load in LiteRT: {str(exc)[:300]}") from None
        why, k, op = found.group(1).strip().replace("\n", " ")[-200:], int(found.group(2)), found.group(3)
    g = TFLiteGraph(path)
    ops = list(g.operators())
    if k >= len(ops) or not ops[k][2]:
        raise ConversionError(f"{path.name} does not load in LiteRT: node {k} ({op}) failed to prepare: {why}")
    return op, g.tensor_name(ops[k][2][0]), why


def interpreter(path: Path, threads: int):
    """LiteRT's interpreter on ``path``, tensors allocated (XNNPACK applied, as verification runs it)."""
    litert = require("ai_edge_litert.interpreter", EXTRA)
    interp = litert.Interpreter(model_path=str(path), num_threads=threads)  # XNNPACK is applied by default
    interp.allocate_tensors()
    return interp


def on_zeros(path: Path, threads: int):
    """The interpreter of ``path`` with zeros in every input: its ``invoke`` is one timed run."""
    interp = interpreter(path, threads)
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
    return interp


def against_float(float_path: Path, path: Path, threads: int = 1) -> tuple[float, float, int, float]:
    """Median ms of the fp32 .tflite ``float_path`` and the build ``path`` on zeros, timed in turns in this
    process (:func:`edgekit.speed.interleaved`): (float ms, build ms, runs of each, share of pairs the build lost)."""
    from edgekit.speed import interleaved

    return interleaved(on_zeros(float_path, threads).invoke, on_zeros(path, threads).invoke)


def latency(path: Path, threads: tuple[int, ...], iters: int = 50, budget_s: float = LATENCY_BUDGET_S
            ) -> dict[str, float]:
    """Median latency (ms) of up to ``iters`` runs on zeros per thread count, as many as fit ``budget_s`` per
    thread count (at least 5, after 3 warm-up runs): a large model on a busy host is not timed 50 times."""
    out = {}
    for t in threads:
        interp = on_zeros(path, t)
        t0 = time.perf_counter()
        for _ in range(3):
            interp.invoke()
        one = max((time.perf_counter() - t0) / 3, 1e-6)
        times = []
        for _ in range(int(min(iters, max(5, budget_s / one)))):
            t0 = time.perf_counter()
            interp.invoke()
            times.append((time.perf_counter() - t0) * 1000)
        out[str(t)] = round(statistics.median(times), 4)
    return out
