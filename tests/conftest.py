"""Shared fixtures: the digits example (real data: scikit-learn's digits) and tiny models."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
# test helpers (model builders, fake servers, the hostile corpus) live in tests/support/
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))


@pytest.fixture(scope="session")
def digits() -> dict[str, Path]:
    paths = {"model": DIGITS / "digits_cnn.pt2", "calib": DIGITS / "calib.npz", "eval": DIGITS / "eval.npz"}
    for p in paths.values():
        assert p.exists(), f"{p} missing: run python examples/digits/train.py"
    return paths


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Keep results stores / calibration files of tests out of the user's data dir."""
    base = tmp_path_factory.getbasetemp() / "edgekit-data"
    base.mkdir(exist_ok=True)
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(base))
    monkeypatch.setenv("EDGEKIT_RESULTS_DB", str(base / "results.sqlite"))
    yield


def pytest_report_header(config):
    return f"edgekit root: {ROOT}; CI={os.environ.get('CI', '')}"
