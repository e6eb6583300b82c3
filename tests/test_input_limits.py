"""The limits behind two refusals of the hostile corpus (tests/support/hostile.py: ``calib_too_large_for_int8``,
``pt2_cut_23_bytes``): calibration data up to the INT8 limit is taken, and whole archives pass the zip-end check."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits"


def test_calibration_data_at_the_limit_is_taken():
    from edgekit.data import CALIB_LIMIT
    from edgekit.data import check_values as _check_values

    _check_values("--calib x.npz", "image", np.full((2, 3), CALIB_LIMIT, np.float32))
    _check_values("--eval x.npz", "image", np.full((2, 3), 3e38, np.float32))  # evaluation has no INT8 scale


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
