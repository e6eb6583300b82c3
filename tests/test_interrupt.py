"""Ctrl-C: one line that says what the cleanup did, exit 130, nothing half-written left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# a command that makes its output through fsutil.atomic_dir and is stopped inside it, the way a convert is
COMMAND = """
import os, signal, sys, time
from pathlib import Path
import edgekit.cli as cli
from edgekit import fsutil

@cli.app.command("write-slowly")
def write_slowly(out: str, how: str) -> None:
    with fsutil.work_dir("edgekit-test-") as work, fsutil.atomic_dir(Path(out)) as tmp:
        (tmp / "half.bin").write_bytes(b"x" * 1000)
        if how == "raise":
            raise KeyboardInterrupt
        print("READY", flush=True)
        time.sleep(60)

sys.argv = ["edgekit", "write-slowly", *sys.argv[1:]]
cli.main()
"""


def _start(*args: str, tmp) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.Popen([sys.executable, "-c", COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def test_keyboard_interrupt_prints_one_line_and_exits_130(tmp_path):
    out = tmp_path / "out"
    proc = _start(str(out), "raise", tmp=tmp_path)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert stderr.strip() == f"interrupted: nothing was written (the partial output for {out} was removed)", stderr
    assert "Traceback" not in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no sibling, no work folder, no lock


def test_sigint_while_writing(tmp_path):
    """The real signal: the handler unwinds, the earlier output at -o stays as it was, and the line says so."""
    out = tmp_path / "out"
    out.mkdir()  # an empty folder: edgekit may replace it
    proc = _start(str(out), "sleep", tmp=tmp_path)
    assert proc.stdout.readline().strip() == "READY"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert lines == [f"interrupted: nothing was written (the partial output for {out} was removed; {out} keeps "
                     "its earlier contents)"], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and not any(out.iterdir())


@pytest.mark.slow
def test_sigint_during_a_real_convert(tmp_path, digits):
    """convert of the digits CNN for jetson, stopped inside its convert stage (the signal is sent from there, so
    it lands at the same point every time)."""
    code = (
        "import os, signal, sys\n"
        "import edgekit.stages as stages\n"
        "def stop(*a, **k):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    import time; time.sleep(30)\n"
        "stages.convert = stop\n"
        "import edgekit.cli as cli\n"
        "sys.argv = ['edgekit', *sys.argv[1:]]\n"
        "cli.main()\n"
    )
    out = tmp_path / "outputs" / "build"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, "convert", str(digits["model"]), "--target", "jetson",
                           "-o", str(out), "--no-cache"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 130, proc.stderr
    assert time.monotonic() - t0 < 200
    assert proc.stderr.strip().splitlines()[-1] == (
        f"interrupted: nothing was written (the partial output for {out} was removed)"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(out.parent.iterdir()) == []  # neither the output nor its sibling
    assert [p.name for p in scratch.iterdir() if p.name.startswith("edgekit-")] == []  # torch keeps its own cache
