"""Run an installed bundle's smoke test on the board and read back its result.

The runner (the manifest's ``runner.entry``, e.g. ``run.py``) runs on the board with the
board's own Python and runtime, streams its log, and writes ``smoke_result.json`` in
the bundle folder: integrity, load, golden outputs within tolerance, latency
p50/p90/p99 against the budget, peak memory, power where the board exposes it. That
file is fetched and returned; nothing is measured on the host.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.bundle import MANIFEST, Unpacked, opened
from edgekit.errors import EdgekitError
from edgekit.flash import default_dest
from edgekit.fsutil import sha256_file
from edgekit.manifest import Manifest
from edgekit.transports.base import Transport

RESULT_FILE = "smoke_result.json"
HOST_BOARD = "host/host"


class SmokeError(EdgekitError):
    """The smoke test could not run on the board (not installed, no result written)."""


@dataclass
class SmokeResult:
    dest: str
    exit_code: int
    result: dict[str, Any]
    seconds: float
    manifest: Manifest

    @property
    def checks(self) -> list[dict[str, Any]]:
        return list(self.result.get("checks", []))

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and bool(self.result.get("passed")) and all(
            c.get("passed") is not False for c in self.checks)

    def record_fields(self) -> dict[str, Any]:
        """What the results store keeps of a smoke run (besides the build's own fields and the host)."""
        r = self.result
        return {"dest": self.dest, "passed": self.passed, "measured_latency_ms": self.latency_p50_ms,
                "latency_ms": r.get("latency_ms"), "peak_rss_mb": r.get("peak_rss_mb"), "power_w": r.get("power_w"),
                "runtime": r.get("runtime"), "checks": self.checks, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 3)}

    @property
    def latency_p50_ms(self) -> float | None:
        """The board's measured p50; None when the runner timed it off the device (not the board's latency)."""
        lat = self.result.get("latency_ms") or {}
        return None if lat.get("on_device") is False else lat.get("p50")


def default_runtime(man: Manifest) -> str | None:
    """On the host board the runner uses the target's host runtime (e.g. onnxruntime)."""
    if man.board.id != HOST_BOARD:
        return None
    try:
        from edgekit.profiles import load_target

        return load_target(man.target).host_runtime
    except EdgekitError:
        return None


def smoke(bundle: str | Path | Unpacked, transport: Transport, dest: str | None = None, python: str | None = None,
          runtime: str | None = None, extra_args: list[str] | None = None,
          on_line: Callable[[str], None] | None = None, timeout: float | None = 1800) -> SmokeResult:
    t0 = time.perf_counter()
    with opened(bundle) as ub:
        man = ub.manifest
        local_manifest_sha = sha256_file(ub.root / MANIFEST)
    dest = transport.resolve(dest or default_dest(man))
    remote_man = posixpath.join(dest, MANIFEST)
    if not transport.exists(remote_man):
        raise SmokeError(f"{dest} on {transport.describe()} holds no bundle; run `edgekit flash` first")
    # the runner's own integrity check hashes every file on the board; here: is it THIS bundle?
    if hashlib.sha256(transport.get(remote_man)).hexdigest() != local_manifest_sha:
        raise SmokeError(f"{dest} on {transport.describe()} holds another bundle (its manifest.json differs); "
                         "run `edgekit flash` with this bundle first")
    if python is None and transport.name == "local" and man.board.id == HOST_BOARD:
        python = sys.executable  # this machine is the board: the Python edgekit runs in has the host runtime
    argv = [python or man.runner.python or "python3", posixpath.join(dest, man.runner.entry)]
    runtime = runtime or default_runtime(man)
    if runtime:
        argv += ["--runtime", runtime]
    argv += list(extra_args or [])
    result_path = posixpath.join(dest, RESULT_FILE)
    transport.remove(result_path)  # never read a stale result
    rc, out = transport.run(argv, on_line=on_line, timeout=timeout)
    if not transport.exists(result_path):
        tail = "\n".join(out.strip().splitlines()[-8:])
        raise SmokeError(f"the runner wrote no {RESULT_FILE} on {transport.describe()} (exit {rc}); its last lines:\n{tail}"
                         + ("\n(no such python? give --python PATH)" if rc == 127 else ""))
    try:
        result = json.loads(transport.get(result_path))
    except ValueError as exc:
        raise SmokeError(f"{RESULT_FILE} on the board is not valid JSON ({exc})") from None
    return SmokeResult(dest, rc, result, time.perf_counter() - t0, man)
