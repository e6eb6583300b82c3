"""The results store: record / measurements / events against a temp SQLite file."""

from __future__ import annotations

import sqlite3

import pytest

from edgekit import results


@pytest.fixture()
def db(tmp_path, monkeypatch):
    path = tmp_path / "r.sqlite"
    monkeypatch.setenv(results.ENV, str(path))
    results.use_db(None)
    return path


def test_record_and_measurements(db):
    results.record("convert", board_id="host/host", model_sha256="aa", precision="int8", out="/x")
    results.record("smoke", board_id="host/host", model_sha256="aa", precision="int8",
                   estimated_latency_ms=None, measured_latency_ms=0.5, passed=True, checks=[{"name": "golden"}])
    results.record("smoke", board_id="host/host", model_sha256="aa", precision="int8",
                   estimated_latency_ms=0.4, measured_latency_ms=0.6, passed=False)
    results.record("smoke", board_id="other/b", model_sha256="bb", precision="fp16", measured_latency_ms=3.0)
    results.record("smoke", board_id="host/host", model_sha256="cc", precision="fp32", passed=False)  # nothing measured
    m = results.measurements("host/host")
    assert [r["measured_latency_ms"] for r in m] == [0.5, 0.6]
    assert m[0]["estimated_latency_ms"] is None and m[1]["estimated_latency_ms"] == 0.4
    assert set(m[0]) == {"model_sha256", "precision", "estimated_latency_ms", "measured_latency_ms", "measured_at"}
    assert m[0]["measured_at"].endswith("Z")
    ev = results.events()
    assert [e["kind"] for e in ev] == ["smoke", "smoke", "smoke", "smoke", "convert"]
    assert ev[-1]["out"] == "/x"
    assert ev[-2]["checks"] == [{"name": "golden"}] and ev[-2]["passed"] is True
    assert sqlite3.connect(db).execute("select count(*) from events").fetchone()[0] == 5


def test_use_db_overrides_env(db, tmp_path):
    other = tmp_path / "sub" / "o.sqlite"
    results.use_db(other)
    try:
        results.record("bundle", board_id="x")
        assert other.exists() and not db.exists()
    finally:
        results.use_db(None)


def test_results_and_calibration_share_edgekit_data_dir(tmp_path, monkeypatch):
    """Without EDGEKIT_RESULTS_DB the store lives in $EDGEKIT_DATA_DIR, beside the calibration fits."""
    from edgekit.calibration_store import save_store, store_path

    monkeypatch.delenv(results.ENV, raising=False)
    monkeypatch.setenv("EDGEKIT_DATA_DIR", str(tmp_path / "data"))
    results.use_db(None)
    results.record("bundle", board_id="host/host")
    save_store("host/host", {"board": "host/host", "samples": [], "fit": None})
    assert results.db_path() == tmp_path / "data" / "results.sqlite" and results.db_path().is_file()
    assert store_path("host/host").is_file() and store_path("host/host").is_relative_to(tmp_path / "data")


def test_unknown_kind_is_a_bug(db):
    with pytest.raises(ValueError):
        results.record("nope")


def test_estimate_from_manifest():
    assert results.estimate_from_manifest({}) is None
    assert results.estimate_from_manifest({"plan": {"estimate": {"latency_ms": 1.5}}}) == 1.5
    assert results.estimate_from_manifest({"estimate": {"latency_ms": 2}}) == 2.0
