"""The calibration store: the cost-model constants ``edgekit calibrate`` fitted for a board, and the samples
they were fitted on, one JSON file per board under edgekit's data folder.

It sits below the cost model (which reads the fit) and below ``edgekit.calibrate`` (which writes it), so
reading a fit never imports the code that builds and times models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgekit.fsutil import atomic_write_bytes, data_root


def store_path(board_id: str) -> Path:
    return data_root() / "calibration" / (board_id.replace("/", "__") + ".json")


def load_store(board_id: str) -> dict[str, Any]:
    p = store_path(board_id)
    if not p.exists():
        return {"board": board_id, "samples": [], "fit": None}
    return json.loads(p.read_text())


def save_store(board_id: str, data: dict[str, Any]) -> Path:
    p = store_path(board_id)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(p, (json.dumps(data, indent=1) + "\n").encode())
    return p


def load_fit(board_id: str) -> dict[str, Any] | None:
    p = store_path(board_id)
    if not p.exists():
        return None
    return json.loads(p.read_text()).get("fit")
