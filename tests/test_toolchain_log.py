"""Toolchain noise (issue 16): what torch, TensorFlow, coremltools, onnxruntime ... print while a build is made
goes into the build's toolchain.log, not the user's screen; ``-v`` shows it live."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

# edgekit's own lines on stderr: a stage or sub-step done, a log line (indented), a warning or a note
OURS = re.compile(r"^(✓ +\S|  \S|warning: |note: )")


def _convert(digits, out, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "500"}  # one line per message: no wrapping to tell apart
    cmd = [sys.executable, "-m", "edgekit", "convert", str(digits["model"]), "-o", str(out),
           "--calib", str(digits["calib"]), "--no-cache", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
@pytest.mark.parametrize("target, precision", [("jetson", "int8"), ("android", "auto"), ("ios", "auto")])
def test_convert_stderr_holds_only_edgekit_lines(digits, tmp_path, target, precision):
    out = tmp_path / target
    proc = _convert(digits, out, "--target", target, "-p", precision)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    foreign = [ln for ln in lines if not OURS.match(ln)]
    assert not foreign, "\n".join(foreign)
    assert {f"✓ {s}" for s in ("ingest", "convert", "verify", "write")} <= {ln.split()[0] + " " + ln.split()[1]
                                                                             for ln in lines if ln.startswith("✓")}
    log = (out / "toolchain.log").read_text()
    assert "toolchain.log" in json.loads((out / "manifest.json").read_text())["files"]  # hashed with the build
    for noise in ("Failed to load", "oneDNN", "has not been tested", "FutureWarning", "Running MIL", "%|"):
        assert noise not in proc.stderr
    if target != "jetson" and sys.platform == "linux":  # what these toolchains print here, now in the log
        # which lines depends on the CPU and the wheels: TensorFlow's oneDNN line only on CPUs it enables oneDNN
        # for (one machine printed it, the next did not); torchao's missing CUDA kernels and LiteRT's XNNPACK line
        assert any(s in log for s in ("oneDNN custom operations", "Failed to load", "XNNPACK delegate")), log[-2000:]
    if target == "ios" and sys.platform == "linux":
        assert "Failed to load _MLModelProxy" in log and "Running MIL" in log


@pytest.mark.slow
def test_verbose_shows_the_toolchains_live(digits, tmp_path):
    out = tmp_path / "v"
    proc = _convert(digits, out, "--target", "android", "-p", "fp32", "-v")
    assert proc.returncode == 0, proc.stderr
    log = (out / "toolchain.log").read_text()
    assert log.strip()
    assert all(ln in proc.stderr for ln in log.splitlines() if ln.strip())


def test_capture_keeps_edgekit_lines_on_screen(capfd, tmp_path):
    from edgekit.quiet import terminal, toolchain_output

    with toolchain_output() as tool:
        os.write(2, b"C++ noise on fd 2\n")
        os.write(1, b"noise on fd 1\n")
        terminal.write("edgekit's own line\n")
        terminal.flush()
        subprocess.run(["sh", "-c", "echo from a child process >&2"], check=True)
        tool.save(tmp_path / "toolchain.log")
    got = capfd.readouterr()
    assert got.err == "edgekit's own line\n" and got.out == ""
    assert (tmp_path / "toolchain.log").read_text().splitlines() == [
        "C++ noise on fd 2", "noise on fd 1", "from a child process"]


def test_echo_shows_the_capture_live_and_keeps_it(capfd, tmp_path):
    from edgekit.quiet import toolchain_output

    with toolchain_output(echo=True) as tool:
        os.write(2, b"C++ noise on fd 2\n")
        tool.save(tmp_path / "toolchain.log")
    assert capfd.readouterr().err == "C++ noise on fd 2\n"
    assert (tmp_path / "toolchain.log").read_text() == "C++ noise on fd 2\n"


def test_a_bug_shows_the_last_captured_lines_a_user_error_does_not(capfd):
    from edgekit.errors import InputSpecError
    from edgekit.quiet import toolchain_output

    with pytest.raises(InputSpecError), toolchain_output():
        os.write(2, b"noise before a user error\n")
        raise InputSpecError("bad input")
    assert capfd.readouterr().err == ""
    with pytest.raises(ZeroDivisionError), toolchain_output():
        os.write(2, b"the context of a bug\n")
        1 / 0  # noqa: B018
    assert "the context of a bug" in capfd.readouterr().err
