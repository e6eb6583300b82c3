"""The real CLI entry point, run in the test's own process (its imports, e.g. TensorFlow, are paid once)."""

from __future__ import annotations

import sys

import pytest


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``edgekit ARGS`` through ``edgekit.cli.main``: (exit code, stdout, stderr)."""
    from edgekit.cli import main

    monkeypatch.setattr(sys, "argv", ["edgekit", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err
