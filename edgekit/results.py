"""The results store: every convert, bundle, flash and smoke, in one SQLite file.

Where the file lives, first match wins: ``use_db(path)`` (the CLI's ``--results-db``),
the environment variable ``EDGEKIT_RESULTS_DB``, else ``results.sqlite`` in edgekit's data
folder (:func:`edgekit.fsutil.data_root`: ``$EDGEKIT_DATA_DIR``, else platformdirs'
``~/.local/share/edgekit`` on Linux) — the folder that also holds the calibration fits.

Each event is one row: its kind, time, board, model hash, precision, bundle name,
estimated and measured latency, pass/fail, and every other field as JSON. The planner's
recalibration reads measured-vs-estimated latency with :func:`measurements`.

    from edgekit import results
    results.record("smoke", board_id="host/host", model_sha256=..., precision="int8",
                   estimated_latency_ms=0.4, measured_latency_ms=0.31, passed=True)
    results.measurements("host/host")  # -> [{model_sha256, precision, estimated_latency_ms, ...}]
"""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ENV = "EDGEKIT_RESULTS_DB"
KINDS = ("convert", "bundle", "flash", "smoke", "matrix")  # matrix: one cell of `edgekit matrix`
# Fields kept in their own columns (queried); everything else lives in `data` (JSON).
COLUMNS = ("board_id", "model_sha256", "precision", "bundle", "estimated_latency_ms", "measured_latency_ms", "passed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    at_utc TEXT NOT NULL,
    board_id TEXT,
    model_sha256 TEXT,
    precision TEXT,
    bundle TEXT,
    estimated_latency_ms REAL,
    measured_latency_ms REAL,
    passed INTEGER,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_board ON events (board_id, kind);
"""

_override: Path | None = None


def use_db(path: str | Path | None) -> None:
    """Point this process's store at ``path`` (None: back to env var / user data dir)."""
    global _override
    _override = Path(path).expanduser() if path else None


def db_path() -> Path:
    if _override is not None:
        return _override
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    from edgekit.fsutil import data_root

    return data_root() / "results.sqlite"


def _connect() -> sqlite3.Connection:
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=10)
    con.row_factory = sqlite3.Row
    con.executescript(_SCHEMA)
    return con


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(kind: str, **fields: Any) -> int:
    """Store one event; returns its id. ``kind`` is one of KINDS; any JSON-able fields."""
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}; one of {KINDS}")
    cols = {c: fields.get(c) for c in COLUMNS}
    if cols["passed"] is not None:
        cols["passed"] = int(bool(cols["passed"]))
    data = json.dumps({k: v for k, v in fields.items() if k not in COLUMNS}, default=str, sort_keys=True)
    with _connect() as con:
        cur = con.execute(
            f"INSERT INTO events (kind, at_utc, {', '.join(COLUMNS)}, data) VALUES (?, ?, {', '.join('?' * len(COLUMNS))}, ?)",
            (kind, fields.get("at_utc") or _now(), *cols.values(), data),
        )
        rid = int(cur.lastrowid)
    con.close()
    return rid


def _row(r: sqlite3.Row) -> dict[str, Any]:
    d = {k: r[k] for k in r.keys() if k != "data"}
    if d.get("passed") is not None:
        d["passed"] = bool(d["passed"])
    d.update(json.loads(r["data"]))
    return d


def events(kind: str | None = None, board_id: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Stored events, newest first."""
    sql, args = "SELECT * FROM events WHERE 1=1", []
    if kind:
        sql += " AND kind = ?"
        args.append(kind)
    if board_id:
        sql += " AND board_id = ?"
        args.append(board_id)
    sql += " ORDER BY id DESC"
    if limit:
        sql += f" LIMIT {int(limit)}"
    con = _connect()
    try:
        return [_row(r) for r in con.execute(sql, args)]
    finally:
        con.close()


def measurements(board_id: str) -> list[dict[str, Any]]:
    """Measured latencies on ``board_id`` (smoke runs that measured one), oldest first.

    Keys: model_sha256, precision, estimated_latency_ms (None when the build carried no
    estimate), measured_latency_ms (p50 on the board), measured_at (UTC ISO time).
    """
    con = _connect()
    try:
        rows = con.execute(
            "SELECT model_sha256, precision, estimated_latency_ms, measured_latency_ms, at_utc FROM events "
            "WHERE kind = 'smoke' AND board_id = ? AND measured_latency_ms IS NOT NULL ORDER BY id",
            (board_id,),
        ).fetchall()
    finally:
        con.close()
    return [
        {"model_sha256": r["model_sha256"], "precision": r["precision"], "estimated_latency_ms": r["estimated_latency_ms"],
         "measured_latency_ms": r["measured_latency_ms"], "measured_at": r["at_utc"]}
        for r in rows
    ]


def estimate_from_manifest(man: Any) -> float | None:
    """The planner's latency estimate carried by a build's manifest, if any."""
    for key in ("plan", "estimate"):
        sec = man.get(key)
        if isinstance(sec, dict):
            est = sec.get("estimate", sec) if key == "plan" else sec
            for k in ("latency_ms", "estimated_latency_ms"):
                if isinstance(est, dict) and isinstance(est.get(k), int | float):
                    return float(est[k])
    return None


def manifest_fields(man: Any) -> dict[str, Any]:
    """The columns every event about one build shares, read from its manifest (a Manifest or its JSON)."""
    if hasattr(man, "to_json"):
        man = man.to_json()
    return {
        "board_id": (man.get("board") or {}).get("id"),
        "model_sha256": (man.get("source_model") or {}).get("sha256"),
        "precision": man.get("precision"),
        "bundle": man.get("name"),
        "estimated_latency_ms": estimate_from_manifest(man),
        "target": man.get("target"),
        "plan": man.get("plan"),
    }
