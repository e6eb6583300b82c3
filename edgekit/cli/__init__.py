"""The edgekit command line: a thin typer layer over the Python API.

Nothing heavy is imported at module level: `edgekit --help` and `edgekit boards` work
without torch, onnx or onnxruntime installed. User errors (EdgekitError) print one line
and exit 2; anything else is a bug and keeps its traceback.

``common`` holds the app, the consoles and the shared options; each command module
(``convert``, ``profiles``, ``flash``, ``plan``) registers its commands on that app and
imports nothing back from this entry module.
"""

from __future__ import annotations

import errno
import signal
import sys

from rich.markup import escape

from edgekit.cli import cache, convert, finetune, flash, fleet, matrix, plan, profiles, zoo  # noqa: F401 - each registers its commands on the app
from edgekit.cli.common import app, console, err  # noqa: F401 - the app and consoles, for callers and tests
from edgekit.errors import EdgekitError

# the machine's state, not edgekit's or the user's input: one line, exit 2, no traceback
_ENV_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EROFS: "the file system is read-only",
               errno.EDQUOT: "disk quota exceeded", errno.EACCES: "permission denied", errno.EPERM: "not permitted"}


def _stop(signum: int, _frame: object) -> None:
    """SIGINT, SIGTERM and SIGHUP unwind: every temporary folder and staging sibling is removed on the way out.
    The signal is remembered too (fsutil.check_stop), in case a toolchain swallows the exception."""
    from edgekit import fsutil

    fsutil.stop_signal = signum
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def stopped_line(signum: int) -> str:
    """One line for a run stopped by a signal: what was written and what the cleanup removed, as it happened."""
    from edgekit import fsutil

    how = "interrupted" if signum == signal.SIGINT else f"stopped ({signal.Signals(signum).name})"
    kept = [d for d in fsutil.abandoned if d.exists()]  # an earlier output at -o that the run would have replaced
    partial = ", ".join(str(d) for d in fsutil.abandoned)
    if not fsutil.written:
        line = f"{how}: nothing was written"
    else:
        line = f"{how}: {', '.join(str(d) for d in fsutil.written)} was written whole before the stop"
    if partial:
        line += (f" (the partial output for {partial} was removed"
                 + (f"; {', '.join(str(d) for d in kept)} keeps its earlier contents)" if kept else ")"))
    elif fsutil.scratch_removed:
        line += " (the temporary work folder was removed)"
    return line


def main() -> None:
    from edgekit import fsutil

    fsutil.notice = lambda m: err.print(f"[dim]note: {escape(m)}[/]", highlight=False, soft_wrap=True)
    # Ctrl-C unwinds too, even where the shell started edgekit with SIGINT ignored (a background job)
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, _stop)
    try:
        app()  # click's standalone mode handles usage errors (exit 2) and Ctrl-C ("Aborted!", exit 1)
    except SystemExit as exc:
        # typer turns KeyboardInterrupt into a silent exit 130; a toolchain may swallow the signal (exit 0)
        if fsutil.stop_signal is not None or exc.code == 130:
            signum = fsutil.stop_signal or signal.SIGINT
            err.print(stopped_line(signum), highlight=False, soft_wrap=True)
            sys.exit(128 + signum)
        raise
    except EdgekitError as exc:
        # escaped: a hint like pip install 'edgekit[plan]' is text, not rich markup
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in _ENV_ERRNOS:
            raise
        name = exc.filename2 or exc.filename  # a copy reports (source, destination): the destination is full
        where = f"{name}: " if name else ""
        err.print(f"[bold red]error:[/] {where}{_ENV_ERRNOS[exc.errno]}; free space, fix the permissions, or choose "
                  "another folder (-o, TMPDIR)", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
