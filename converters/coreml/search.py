"""Core ML's mixed-precision hooks (:mod:`edgekit.mixed.search`): the conv / linear / matmul layers a W8A8 build
may leave in fp16, ranked by the SQNR of their int8 input, and the fake-quant programs the search measures."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from edgekit.converters import Artifact, ConvertJob
from edgekit.converters.coreml.w8a8 import comparisons_as_coreml_reads_them, inputs_float, w8a8_quantizer

from edgekit.deps import require
from edgekit.mixed.search import Layer, Search, search_feeds
from edgekit.mixed.search import db as mixed_db


def mixed_unavailable(job: ConvertJob) -> str | None:
    if sys.platform == "darwin":
        return ("on macOS W8A8 is calibrated by Core ML (linear_quantize_activations), which keeps no chosen "
                "layer in fp16; pass --tolerance to accept this agreement")
    return None


def mixed_search(job: ConvertJob, artifact: Artifact) -> Search:
    """The conv / linear / matmul layers a W8A8 build may leave in fp16 (no quantize / dequantize on their
    input, fp16 weights), ranked by the SQNR of their int8 input; the search runs PT2E's fake-quant program
    in torch (fp32 elsewhere: the real re-verification runs the converted package)."""
    from edgekit.converters.common.pt2e import (
        SEARCH_CALIB,
        calibrated,
        exported_module,
        observer_outputs,
        torch_module,
        torch_run,
        torch_sample,
    )

    m = job.model
    sample = torch_sample(m)
    module = exported_module(job, torch_module(job), sample)
    comparisons_as_coreml_reads_them(module)
    method = artifact.meta["quantization"]["calibration_method"]
    base = tuple(job.options.get("keep_float_nodes") or ())
    search = search_feeds(job)

    programs: dict[str, Any] = {}  # observer -> its fake-quant program with no layer kept

    def fake_quant(keep: tuple[str, ...], observer: str = method):
        # calibrated once per observer: a W8A8 layer kept fp16 only loses the quantize / dequantize on its own
        # inputs and weight, and the observers saw float values either way, so the other layers' ranges are
        # the same as a calibration with it left unannotated (no calibration per build)
        if observer not in programs:
            programs[observer] = calibrated(job, module, sample, observer, lambda obs: w8a8_quantizer(obs, base),
                                            limit=SEARCH_CALIB)[0]
        return inputs_float(programs[observer], keep)

    layers = w8a8_layers(fake_quant(()), search[:8], m)
    ref = torch_run(module, search, m)
    outputs, calibration_for = observer_outputs(lambda kept, obs: fake_quant(tuple(kept), obs), job,
                                                method, ref, search)
    return Search(layers, outputs, ref, "fp16 (no int8 quantize / dequantize on its input; fp16 weights)",
                  calibration_for)


def w8a8_layers(converted: Any, feeds: list[dict[str, np.ndarray]], m: Any) -> list[Layer]:
    """Each conv / linear / matmul of a W8A8 fake-quant program with the SQNR of its int8 input (the tensor
    before and after its quantize / dequantize, on the same runs) or, where lower, of its int8 weights at its
    output: the cheap ranking of the mixed search."""
    torch = require("torch")
    from edgekit.converters.common.fxrecord import reads_input, record_quantized

    seen, weights = record_quantized(converted, feeds, m, skip_dequantize=True)

    def producer(node: Any) -> Any:  # dequantize(quantize(x)) -> x
        while isinstance(node, torch.fx.Node) and "quantize" in str(node.target) and node.args:
            node = node.args[0]
        return node

    layers = []
    for n in converted.graph.nodes:
        if n.op != "call_function" or not any(k in str(n.target) for k in ("conv", "linear", "matmul", "bmm")):
            continue
        x = producer(n.args[0]) if n.args else None
        if not isinstance(x, torch.fx.Node) or x.name not in seen or x is n.args[0]:
            continue  # not quantized (kept, or not an annotated layer)
        a = np.concatenate([u.ravel() for u, _ in seen[x.name]]).astype(np.float64)
        d = np.concatenate([v.ravel() for _, v in seen[x.name]]).astype(np.float64)
        local = mixed_db(float(np.sum(a ** 2)), float(np.sum((a - d) ** 2)))
        if n.name in weights:  # its int8 weights at its output, where they lose more than its input does
            local = min(local, mixed_db(*weights[n.name]))
        layers.append(Layer(n.name, str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target),
                            round(local, 2), reads_input=reads_input(n)))
    return layers
