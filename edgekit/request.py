"""A convert request checked before any work: every option the user gave is refused here, by name, before a model
is loaded (and again before the build cache answers), and the target, board and precision it names are resolved."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.carry import check_sequence_length, parse_carries
from edgekit.data import max_data_bytes
from edgekit.errors import InputSpecError, ProfileError
from edgekit.fsutil import check_replaceable
from edgekit.input_spec import parse_batch_axes
from edgekit.profiles import Board, Target, default_board, load_board, load_target, override_tolerances
from edgekit.stages import GOLDEN_DEFAULT, check_precision

MIN_OPSET, MAX_OPSET = 7, 25  # what onnx and onnxruntime know of; per-channel INT8 needs 13 or more


@dataclass(frozen=True)
class Request:
    """What a convert call resolved its arguments to."""

    target: Target  # with the --tolerance overrides
    board: Board  # with the --set overrides
    precision: str  # as asked ("auto": the plan stage chooses)
    options: dict[str, Any] | None  # the --option values the converter's model checked; None: none given


def check_request(target: str, board: str | None, board_set: list[str] | None, precision: str | None,
                  golden_count: int, opset: int | None, max_data_mb: float | None, out: str | Path | None,
                  tolerance: dict[str, float] | None, options: dict[str, Any] | None,
                  batch_axes: list[str] | None = None, carries: list[str] | None = None,
                  sequence_length: int | None = None) -> Request:
    """Every argument of a convert call checked, and the profiles it names loaded; raises the EdgekitError that says
    what was wrong. ``--calib`` for INT8 is checked by the data stage: an op refusal comes first."""
    from edgekit.converters import check_options

    if isinstance(golden_count, bool) or not isinstance(golden_count, int) or golden_count < 1:
        raise InputSpecError(f"--golden {golden_count}: give the number of golden samples, at least 1 "
                             f"(default {GOLDEN_DEFAULT})")
    if opset is not None and not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputSpecError(f"--opset {opset}: give an ONNX opset from {MIN_OPSET} to {MAX_OPSET}, "
                             "or leave it out for the target's default")
    parse_batch_axes(batch_axes)  # a malformed --batch-axis is refused before the build cache answers
    parse_carries(carries)  # and a malformed --carry; its names are checked against the model at ingest
    check_sequence_length(sequence_length, carries)
    max_data_bytes(max_data_mb)  # a bad --max-data-mb is refused even when the build then comes from the cache
    if out is not None:  # a foreign -o is refused before minutes of work, and again at the end
        check_replaceable(Path(os.path.abspath(out)))
    tgt = load_target(target)
    if tolerance:
        tgt = override_tolerances(tgt, tolerance)
    checked = check_options(tgt.converter, options) or None
    brd = load_board(board, board_set) if board else default_board(target)
    if board_set and not board:
        brd = load_board(brd.id, board_set)
    if target not in brd.targets:
        raise ProfileError(f"board {brd.id} does not take target {target!r} (its targets: {brd.targets})")
    precision = precision or tgt.default_precision
    if precision != "auto":  # "auto" is resolved by the plan stage from the analysis
        check_precision(precision, tgt, brd)
    return Request(tgt, brd, precision, checked)


def warn_unshowable_bar(tolerance: dict[str, float] | None, n: int, kinds: dict[str, str],
                        warn: Callable[[str], None]) -> None:
    """Warn where a --tolerance agreement bar is more than n golden samples can show: all n agreeing proves only
    n / (n + 1.96^2) (the Wilson 95% interval's low end), and below one disagreement in n the bar is 100%."""
    if not tolerance or "min_top1_agreement" not in tolerance:
        return
    bar = float(tolerance["min_top1_agreement"])
    z2 = 1.96 ** 2
    if not 0 < bar < 1 or not {"class", "ctc"} & set(kinds.values()) or n / (n + z2) >= bar:
        return
    need = math.ceil(z2 * bar / (1 - bar))
    warn(f"--tolerance min_top1_agreement={bar:g} on {n} golden samples: all {n} agreeing shows only "
         f"{n / (n + z2):.1%} (the 95% interval's low end), and one disagreement is {100 / n:.1f} points, so a build "
         f"that agrees on fewer inputs than the bar can pass it. Give --golden {need} or more (the --eval or --calib "
         "file must hold that many samples) for a bar the check can show")
