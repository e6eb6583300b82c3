"""Two hostile inputs refused before any toolchain sees them: calibration data too large for INT8 scales, and a
.pt2 cut short (its zip central directory gone). Each: exit 2, one line naming the problem, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def _convert(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    return subprocess.run([sys.executable, "-m", "edgekit", "convert", *args, "--target", "jetson", "--no-cache",
                           "-o", str(tmp_path / "out" / "build")], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)


def _refused(proc: subprocess.CompletedProcess, tmp_path: Path, *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr and "AssertionError" not in proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no output, no sibling
    assert [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("edgekit-")] == []


def test_calibration_data_too_large_for_int8(tmp_path):
    """All 3e38: finite, but a symmetric INT8 range over it overflows float32 (the quantizer asserted)."""
    calib = tmp_path / "huge.npz"
    with np.load(DIGITS / "calib.npz") as d:
        np.savez(calib, **{k: np.full(v.shape, 3e38, np.float32) for k, v in d.items()})
    proc = _convert(tmp_path, str(DIGITS / "digits_cnn.pt2"), "-p", "int8", "--calib", str(calib))
    _refused(proc, tmp_path, "too large for INT8 calibration", "overflow float32", "'image'")


def test_calibration_data_at_the_limit_is_taken():
    from edgekit.data import CALIB_LIMIT, _check_values

    _check_values("--calib x.npz", "image", np.full((2, 3), CALIB_LIMIT, np.float32))
    _check_values("--eval x.npz", "image", np.full((2, 3), 3e38, np.float32))  # evaluation has no INT8 scale


def test_a_pt2_cut_short_is_truncated_not_untrusted(tmp_path):
    cut = tmp_path / "cut.pt2"
    cut.write_bytes((DIGITS / "digits_cnn.pt2").read_bytes()[:-23])
    proc = _convert(tmp_path, str(cut))
    _refused(proc, tmp_path, "truncated or corrupt", "central directory is missing")
    assert "--trust-pickle" not in proc.stderr


def test_zip_end_check_takes_whole_archives(tmp_path):
    import zipfile

    from edgekit.safety import check_zip_end

    with open(DIGITS / "digits_cnn.pt2", "rb") as f:
        check_zip_end(f, "digits_cnn.pt2")
        assert f.tell() == 0
    commented = tmp_path / "c.zip"
    with zipfile.ZipFile(commented, "w") as zf:
        zf.writestr("a.txt", "PK\x05\x06 inside a member")
        zf.comment = b"a comment"
    with open(commented, "rb") as f:
        check_zip_end(f, "c.zip")
