"""Toolchain noise, kept off the user's screen: the one place edgekit silences, captures or shortens what
third-party code prints (a user reads "Failed to load ..." or a 40-line trace as the failure)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path


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


TOOLCHAIN_LOG = "toolchain.log"  # in every build: what the toolchains printed while it was made
_terminal: io.TextIOWrapper | None = None  # stderr as it was before the outermost toolchain capture began


class _Terminal(io.TextIOBase):
    """Where edgekit's own messages go (the CLI's consoles write here): the process's stderr, or while a
    :func:`toolchain_output` capture runs, the stderr from before it began, so edgekit's lines stay on screen
    while the toolchains' are captured."""

    def _f(self):  # noqa: ANN202 - a text stream
        return _terminal if _terminal is not None else sys.stderr

    def write(self, s: str) -> int:
        return self._f().write(s)

    def flush(self) -> None:
        self._f().flush()

    def isatty(self) -> bool:
        return self._f().isatty()

    def fileno(self) -> int:
        return self._f().fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._f(), "encoding", None) or "utf-8"


terminal = _Terminal()


class ToolchainOutput:
    """What the toolchains printed during a :func:`toolchain_output` block; ``save`` ends the capture."""

    def __init__(self, echo: bool) -> None:
        self.echo = echo
        self.chunks: list[bytes] = []
        self._stop: Callable[[], None] = lambda: None

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def save(self, path: Path) -> None:
        """End the capture and write what it caught to ``path`` (the build's toolchain.log)."""
        self._stop()
        path.write_text(self.text())


@contextlib.contextmanager
def toolchain_output(echo: bool = False) -> Iterator[ToolchainOutput]:
    """Everything the toolchains write during the block goes to the returned record instead of the screen:
    file descriptors 1 and 2 are redirected into a pipe, so C/C++ logs (absl, oneDNN), Python warnings,
    logging, print, progress bars and child processes are all caught; with ``echo`` they are also shown
    live (``-v``). edgekit's own messages keep reaching the screen through :data:`terminal`. A block that
    fails with a bug (not an EdgekitError, whose one line says it all) shows the last lines it caught.
    Nested blocks capture for themselves and echo into the outer one. The file descriptors are the
    process's: two threads must not capture at once (parallel builds run in processes: `edgekit matrix`)."""
    global _terminal
    out = ToolchainOutput(echo)
    try:
        for s in (sys.stdout, sys.stderr):
            s.flush()
        saved = (os.dup(1), os.dup(2))
    except (OSError, AttributeError, ValueError):  # no real fds (an embedding host): nothing to capture
        yield out
        return
    outer = _terminal
    try:
        on_fd2 = sys.stderr.fileno() == 2
    except (OSError, AttributeError, ValueError):
        on_fd2 = False
    opened = outer is None and on_fd2  # else edgekit's lines go where sys.stderr goes (a test's runner)
    if opened:
        _terminal = io.TextIOWrapper(os.fdopen(os.dup(saved[1]), "wb", buffering=0), encoding="utf-8",
                                     errors="replace", line_buffering=True)
    read, write = os.pipe()
    os.dup2(write, 1)
    os.dup2(write, 2)
    os.close(write)

    def drain() -> None:
        while chunk := os.read(read, 1 << 16):
            out.chunks.append(chunk)
            if echo:
                with contextlib.suppress(OSError):
                    os.write(saved[1], chunk)

    reader = threading.Thread(target=drain, name="edgekit-toolchain-log", daemon=True)
    reader.start()
    stopped = False

    def stop() -> None:
        global _terminal
        nonlocal stopped
        if stopped:
            return
        stopped = True
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                s.flush()  # Python's buffered writes reach the pipe, not the screen after it
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        reader.join(timeout=5)  # EOF once the last write end is gone (a lingering child may hold one)
        for fd in (read, *saved):
            os.close(fd)
        if opened and _terminal is not None:
            _terminal.close()
            _terminal = None

    out._stop = stop
    try:
        yield out
    except BaseException as exc:
        stop()
        from edgekit.errors import EdgekitError

        lines = [ln for ln in out.text().splitlines() if ln.strip()]
        if lines and not echo and not isinstance(exc, EdgekitError | KeyboardInterrupt):  # a bug: its context
            terminal.write(f"toolchain output, last {min(5, len(lines))} of {len(lines)} lines (-v shows all):\n"
                           + "\n".join(f"  {ln[:300]}" for ln in lines[-5:]) + "\n")
        raise
    finally:
        stop()
