"""convert's progress on stderr: one rich display with a row per pipeline stage (a spinner while it runs, its
time when done) and indented rows for the sub-steps of long ones (calibration, compilation). Where stderr is
not a terminal, or ``-v`` shows the toolchains' own output between edgekit's, it prints one line per finished
stage instead (a live display would be torn by the toolchains' lines)."""

from __future__ import annotations

import re
from typing import Any

from edgekit.cli.common import err


class StageProgress:
    def __init__(self, live: bool) -> None:
        self.rows: dict[str, Any] = {}
        self.progress = None
        if live and err.is_terminal:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(
                SpinnerColumn(finished_text="[green]✓[/]"), TextColumn("{task.description:<18}"),
                BarColumn(bar_width=20), TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                console=err, redirect_stdout=False, redirect_stderr=False,  # the toolchains' output is captured
            )

    def __enter__(self) -> StageProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.progress is not None:
            if exc_type is not None:  # the running rows say so rather than keep a frozen spinner frame
                for task in self.progress.tasks:
                    if not task.finished:
                        self.progress.update(task.id, status="[yellow]stopped[/]")
                        self.progress.stop_task(task.id)
            self.progress.stop()

    def on_stage(self, name: str, msg: str) -> None:
        """The pipeline's ``on_stage``: ``name`` is a stage or ``stage/sub-step``; ``msg`` is "start", a count
        "3/16", a count with the row's words "3/16: layer 4 of 16, ~12 s left" (edgekit.mixed.eta), or the time
        taken. Counts show only in the live display: a log gets one line per finished row."""
        sub = "/" in name
        label = ("  " + name.split("/", 1)[1]) if sub else name
        count = re.fullmatch(r"(\d+)/(\d+)(?:: (.+))?", msg)
        if self.progress is None:
            if msg != "start" and not count:
                err.print(f"[green]✓[/] {label:<12} {msg}", highlight=False)
            return
        p = self.progress
        if name not in self.rows:
            self.rows[name] = p.add_task(label, total=None, status="")
        if count:
            p.update(self.rows[name], completed=int(count[1]), total=int(count[2]), status=count[3] or msg)
        elif msg != "start":
            p.update(self.rows[name], completed=1, total=1, status=msg)
            p.stop_task(self.rows[name])
