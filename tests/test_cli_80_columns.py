"""At 80 columns every table and help page fits, and no word (a board id, a precision) is broken."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console
from rich.table import Table

BOARD_IDS = ("nvidia/jetson-orin-nano-8gb", "generic/android-arm64", "apple/iphone-15-pro")


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, (args, proc.stderr)
    return proc


def _fits(text: str, *tokens: str) -> None:
    lines = text.splitlines()
    assert max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)
    assert "…" not in text, text
    for tok in tokens:
        assert tok in text, (tok, text)


def test_boards_keep_precisions_and_ids_whole():
    _fits(_run("boards").stdout, "int8-dynamic", "int8-weight", *BOARD_IDS)


def test_results_keep_board_ids_whole(tmp_path):
    from edgekit import results

    db = tmp_path / "r.sqlite"
    results.use_db(db)
    try:
        for board in BOARD_IDS:
            results.record("convert", board_id=board, precision="int8-dynamic", bundle="digits_cnn-jetson-int8",
                           model_sha256="ab" * 32, estimated_latency_ms=0.4, passed=True)
    finally:
        results.use_db(None)
    _fits(_run("results", env={"EDGEKIT_RESULTS_DB": str(db)}).stdout, "int8-dynamic", *BOARD_IDS)


def test_a_wide_table_fits_or_says_it_cannot():
    """fit(): the cache's table at 80 columns cannot keep model paths and board ids whole in eight columns (False,
    the command then stacks cells); its stacked form fits, every word whole."""
    from edgekit.cli.common import fit

    con = Console(width=80, file=io.StringIO(), color_system=None)
    rows = [("22266673c53b", "analysis", "examples/digits/digits_cnn.pt2", "jetson", "nvidia/jetson-orin-nano-8gb",
             "int8-dynamic", "0.070 MB", "18 min ago")]
    wide = Table()
    for col in ("key", "kind", "model", "target", "board", "precision", "size", "built"):
        wide.add_column(col)
    for r in rows:
        wide.add_row(*r)
    assert not fit(wide, con)
    narrow = Table()
    for col in ("key", "kind", "model", "build", "size", "built"):
        narrow.add_column(col, no_wrap=col in ("key", "size"))
    narrow.add_row("22266673", "analysis", "digits_cnn.pt2", "jetson int8-dynamic\nnvidia/jetson-orin-nano-8gb",
                   "0.070 MB", "18 min ago")
    assert fit(narrow, con)
    con.print(narrow)
    _fits(con.file.getvalue(), "nvidia/jetson-orin-nano-8gb", "int8-dynamic", "digits_cnn.pt2")


@pytest.mark.parametrize("command", [[], ["convert"], ["plan"], ["results"], ["boards"], ["cache", "ls"], ["bundle"]])
def test_help_fits_and_flags_show_no_type(command):
    out = _run(*command, "--help").stdout
    _fits(out)
    assert "<bool>" not in out
    if command == ["convert"]:
        assert "detection_cf, ctc" in out  # --output-kind's choices, whole


@pytest.mark.slow
def test_plan_table_rows_on_one_line(digits):
    out = _run("plan", str(digits["model"]), "--board", "jetson-orin-nano-8gb").stdout
    _fits(out, "nvidia/jetson-orin-nano-8gb")
    rows = [ln for ln in out.splitlines() if ln.lstrip().startswith(("fp32 /", "fp16 /", "int8 /"))]
    assert rows and all("yes" in ln or "no:" in ln for ln in rows), out
