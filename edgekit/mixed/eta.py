"""The time a search has left, in words: each step is timed, and what is left is the mean measured step times the
steps left, never more than the time budget left (the search stops there). What the progress display shows for a
step: ``"3/16: layer 4 of 16, ~12 s left"`` (the count before the colon fills the bar; the words after it are the
row's status, short enough for an 80-column terminal)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable


def seconds_left(took: list[float], steps_left: int, budget_left_s: float) -> float | None:
    """The mean of the measured step times ``took`` times ``steps_left``, at most ``budget_left_s`` (never below
    0); None before any step was measured (a step served from the cache takes no time and is not one)."""
    if steps_left <= 0:
        return 0.0
    if not took:
        return None
    return max(0.0, min(sum(took) / len(took) * steps_left, budget_left_s))


def left_text(seconds: float | None) -> str:
    """``~12 s left``, ``~3 min left``, ``<1 s left``; empty where nothing was measured yet."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    if seconds < 1:
        return "<1 s left"
    if seconds < 90:
        return f"~{seconds:.0f} s left"
    return f"~{seconds / 60:.0f} min left"


def step_text(i: int, n: int, seconds: float | None, unit: str = "layer") -> str:
    """``layer 4 of 16, ~12 s left``: step ``i`` (1-based, the one running) of ``n``, and the time left."""
    left = left_text(seconds)
    return f"{unit} {i} of {n}" + (f", {left}" if left else "")


def step_msg(i: int, n: int, seconds: float | None, unit: str = "layer") -> str:
    """The progress message of step ``i`` of ``n`` starting: ``"3/16: layer 4 of 16, ~12 s left"`` (``i - 1``
    steps done)."""
    return f"{i - 1}/{n}: {step_text(i, n, seconds, unit)}"


class Steps:
    """One phase of a search (the sensitivity scan, the keep steps) as the progress display sees it: ``start`` a
    step (its message names the step and the time left), ``measured`` what a step's build took, ``end`` the
    phase with the time it took. ``report(name, msg)`` is the pipeline's sub-step callback; ``deadline`` is on
    ``clock`` (the search's own clock)."""

    def __init__(self, name: str, report: Callable[[str, str], None], deadline: float, unit: str = "layer",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.name, self.report, self.deadline, self.unit, self.clock = name, report, deadline, unit, clock
        self.took: list[float] = []
        self.t0 = clock()
        self.started = False

    def measured(self, seconds: float) -> None:
        self.took.append(seconds)

    def open(self) -> None:
        """The phase begins (its row appears), before its first numbered step."""
        if not self.started:
            self.t0 = self.clock()
            self.report(self.name, "start")
            self.started = True

    def start(self, i: int, n: int) -> None:
        """Step ``i`` (1-based) of at most ``n`` begins."""
        self.open()
        left = seconds_left(self.took, n - i + 1, self.deadline - self.clock())
        self.report(self.name, step_msg(i, n, left, self.unit))

    def end(self) -> None:
        if self.started:
            self.report(self.name, f"{self.clock() - self.t0:.2f} s")
            self.started = False
