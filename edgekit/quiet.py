"""Toolchain noise, kept off the user's screen: the one place edgekit silences, captures or shortens what
third-party code prints (a user reads "Failed to load ..." or a 40-line trace as the failure)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator


def first_line(exc: BaseException, limit: int = 240) -> str:
    """The first line of an exception's message (its type name when it has none), at most ``limit`` chars."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else type(exc).__name__


@contextlib.contextmanager
def capture_fd2(sink: io.StringIO | None = None, replay_on_error: bool = False) -> Iterator[None]:
    """What C/C++ code writes to file descriptor 2 during the block goes to ``sink`` (or nowhere): absl's
    "oneDNN custom operations are on", TFLiteConverter's "fully_quantize: 0 ...". With ``replay_on_error``
    the last lines are written back to stderr when the block fails."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, AttributeError, ValueError):  # no real fd 2 (an embedding host): nothing to capture
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            if sink is not None:
                sink.write(text)
            if failed and replay_on_error and text.strip():
                sys.stderr.write("\n".join(text.strip().splitlines()[-5:]) + "\n")


def quiet_python(root_logger: bool = True) -> contextlib.ExitStack:
    """Python-level noise off for the block: stdout (progress trees), warnings, and (optionally) the root
    logger below ERROR; everything is restored on exit."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    if root_logger:
        root = logging.getLogger()
        stack.callback(root.setLevel, root.level)
        root.setLevel(logging.ERROR)
    return stack


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The named loggers (e.g. torch's, while it reads a damaged archive) silent for the block."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels, strict=True):
            lg.setLevel(lv)
