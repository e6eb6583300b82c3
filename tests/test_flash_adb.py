"""The adb transport against FakeAdbServer (no phone can be reached here), and shellcheck
over every bundle shell script in firmware/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_adb import SERIAL, FakeAdbServer
from flash_support import ROOT, bundle_file_count, digits_bundle

from edgekit.flash import flash
from edgekit.smoke import smoke
from edgekit.transports import open_transport
from edgekit.transports.adb import AdbTransport
from edgekit.transports.base import TransportError


@pytest.fixture()
def adb():
    with FakeAdbServer() as server:
        yield server


def test_adb_shell_quoting_and_exit_codes(adb, tmp_path):
    t = open_transport(f"adb:{SERIAL}", adb_server=f"127.0.0.1:{adb.port}")
    assert isinstance(t, AdbTransport) and t.describe() == f"adb:{SERIAL}"
    marker = tmp_path / "pwned"
    rc, out = t.run(["echo", f"x; touch {marker}", "$(id)"])
    assert (rc, out) == (0, f"x; touch {marker} $(id)\n") and not marker.exists()
    assert t.run(["sh", "-c", "echo err >&2; exit 3"]) == (3, "err\n")
    lines = []
    t.run(["printf", "a\\nb\\n"], on_line=lines.append)
    assert lines == ["a", "b"]
    assert any(c.startswith("shell:") for c in adb.commands)


def test_adb_push_pull_and_hash(adb, tmp_path):
    t = AdbTransport(server=f"127.0.0.1:{adb.port}")  # the only device, found by host:devices
    src = tmp_path / "blob.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    seen = []
    t.put(str(src), str(tmp_path / "dev" / "blob.bin"), progress=seen.append)
    assert seen[-1] == src.stat().st_size and len(seen) > 1  # progress per chunk
    assert t.get(str(tmp_path / "dev" / "blob.bin")) == src.read_bytes()
    import hashlib

    h = t.sha256([str(tmp_path / "dev" / "blob.bin"), str(tmp_path / "missing")])
    assert h == {str(tmp_path / "dev" / "blob.bin"): hashlib.sha256(src.read_bytes()).hexdigest(),
                 str(tmp_path / "missing"): None}


def test_adb_flash_and_smoke(adb, tmp_path):
    """The whole flash (staging, on-device hashes, rename) and smoke, spoken over the adb protocol."""
    t = AdbTransport(serial=SERIAL, server=f"127.0.0.1:{adb.port}")
    dest = tmp_path / "phone" / "digits"
    res = flash(digits_bundle(), t, dest=str(dest))
    assert len(res.uploaded) == bundle_file_count() and (dest / "manifest.json").exists() and not Path(f"{dest}.staging").exists()
    assert flash(digits_bundle(), t, dest=str(dest)).already_installed
    s = smoke(digits_bundle(), t, dest=str(dest), python=sys.executable, runtime="onnxruntime")
    assert s.passed, s.result
    assert any(c.startswith("sync:") or c == "sync:" for c in adb.commands)


def test_adb_errors_are_one_line(adb, tmp_path):
    with pytest.raises(TransportError, match="cannot reach device NOPE"):
        AdbTransport(serial="NOPE", server=f"127.0.0.1:{adb.port}")
    port = adb.port
    adb.__exit__()
    with pytest.raises(TransportError, match="no adb server .*adb start-server"):
        AdbTransport(server=f"127.0.0.1:{port}")


SCRIPTS = sorted(p for p in (ROOT / "firmware").rglob("*.sh"))


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_bundle_scripts_pass_shellcheck(script):
    res = subprocess.run(["shellcheck", "-x", "-S", "warning", str(script)], check=False, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_there_are_bundle_scripts_to_check():
    assert SCRIPTS, "no firmware/**/*.sh found: the shellcheck test would check nothing"
