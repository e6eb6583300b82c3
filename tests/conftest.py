"""Shared fixtures: the digits example (real data: scikit-learn's digits) and tiny models."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"
# the CLI's rich consoles are made at import and size themselves by COLUMNS (80 where no terminal is attached,
# as in an xdist worker): tests read whole lines of its output, so it is wide here; the 80-column tests set
# COLUMNS=80 for the processes they start
os.environ["COLUMNS"] = "200"
# test helpers (model builders, fake servers, the hostile corpus) live in tests/support/
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))


@pytest.fixture(scope="session")
def digits() -> dict[str, Path]:
    paths = {"model": DIGITS / "digits_cnn.pt2", "calib": DIGITS / "calib.npz", "eval": DIGITS / "eval.npz"}
    for p in paths.values():
        assert p.exists(), f"{p} missing: run python examples/digits/train.py"
    return paths


@pytest.fixture(scope="session", autouse=True)
def _isolated_user_dirs(tmp_path_factory):
    """Tests touch nothing outside pytest's own temporary folder. Session-scoped, so it is set up before any
    module-scoped fixture builds something: edgekit's data folder (results store, calibration fits) and TMPDIR
    (edgekit's work folders, the toolchains' caches, subprocesses) and HOME (where the host board flashes) all live
    under the session's basetemp."""
    import tempfile

    base = tmp_path_factory.getbasetemp()
    data, tmp, home = base / "edgekit-data", base / "tmp", base / "home"
    for d in (data, tmp, home):
        d.mkdir(exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home))  # the host board flashes to ~/edgekit: each test run (and xdist worker) its own
    mp.setenv("EDGEKIT_DATA_DIR", str(data))
    mp.setenv("EDGEKIT_RESULTS_DB", str(data / "results.sqlite"))
    mp.setenv("TMPDIR", str(tmp))
    mp.setattr(tempfile, "tempdir", str(tmp))
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _own_build_cache(tmp_path_factory, monkeypatch):
    """Each test converts with an empty build cache of its own (a test that breaks a converter on purpose must not
    be served the build another test verified); module-scoped fixtures, set up before this, share the session's
    cache under the data folder, so identical builds in two modules are built once."""
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("edgekit-cache", numbered=True)))


def pytest_report_header(config):
    return f"edgekit root: {ROOT}; CI={os.environ.get('CI', '')}"
