"""Core ML's precisions as compressions of the fp16 program (``coremltools.optimize.coreml``): what each stores,
the iOS it needs, and the pass that applies it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgekit.converters import ConvertJob
from edgekit.converters.coreml.mlprogram import EXTRA
from edgekit.deps import require
from edgekit.errors import ProfileError

WEIGHT_THRESHOLD = 2048  # coremltools' default: smaller tensors are not worth compressing


@dataclass(frozen=True)
class Compression:
    method: str | None  # None | linear | palettize | prune | w8a8
    bits: float  # storage bits per compressed weight element (incl. mask for pruning)
    min_ios: int
    describe: str


COMPRESSIONS: dict[str, Compression] = {
    "fp32": Compression(None, 32, 15, "fp32 weights and compute"),
    "fp16": Compression(None, 16, 15, "fp16 weights and compute, fp32 I/O"),
    "int8-weight": Compression("linear", 8, 16, "int8 symmetric per-channel weights (linear_quantize_weights)"),
    "int6-weight": Compression("palettize", 6, 16, "6-bit k-means palettized weights (per-tensor LUT)"),
    "int4-weight": Compression("palettize", 4, 16, "4-bit k-means palettized weights (per-tensor LUT)"),
    "prune-50": Compression("prune", 9, 16, "50% magnitude-pruned weights: 1-bit mask + fp16 non-zeros"),
    "int8": Compression("w8a8", 8, 17, "W8A8: int8 activations calibrated with Core ML predict + int8 weights"),
}


def deployment_target(job: ConvertJob) -> int:
    comp = COMPRESSIONS[job.precision]
    board_ios = job.board.min_ios
    if board_ios is None:
        raise ProfileError(f"board {job.board.id} has no min_ios; give it with --set min_ios=17")
    if board_ios < comp.min_ios:
        raise ProfileError(
            f"precision {job.precision} needs Core ML for iOS {comp.min_ios}+, but board {job.board.id} "
            f"targets iOS {board_ios}; raise it with --set min_ios={comp.min_ios} (drops older devices) "
            f"or choose fp16"
        )
    if board_ios > 18:
        return 18  # the newest target coremltools 9 writes; newer iOS run iOS 18 programs
    return board_ios


def compress(job: ConvertJob, mlmodel: Any, comp: Compression, threshold: int) -> Any:
    """The fp16 program compressed as ``comp`` asks (weights below ``threshold`` elements stay fp16); W8A8 by
    Core ML predict on --calib (macOS only)."""
    if comp.method is None:
        return mlmodel
    cto = require("coremltools.optimize.coreml", EXTRA)
    if comp.method == "linear":
        op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                         weight_threshold=threshold)
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    if comp.method == "palettize":
        require("sklearn", EXTRA)  # k-means clustering
        nbits = int(comp.bits)
        op = cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_tensor",
                                    weight_threshold=threshold)
        return cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    if comp.method == "prune":
        op = cto.OpMagnitudePrunerConfig(target_sparsity=0.5, weight_threshold=threshold)
        return cto.prune_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    if comp.method == "w8a8":  # macOS only (checked before converting)
        assert job.calib is not None  # the pipeline refuses int8 without --calib
        samples = [{k: v.astype(np.float32) for k, v in f.items()} for f in job.calib.batches(job.model)]
        act = cto.OpLinearQuantizerConfig(mode="linear_symmetric", weight_threshold=threshold)
        mlmodel = cto.linear_quantize_activations(mlmodel, cto.OptimizationConfig(global_config=act), samples)
        w = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                        weight_threshold=threshold)
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=w))
    raise AssertionError(comp.method)
