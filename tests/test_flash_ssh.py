"""Flash and smoke over a REAL OpenSSH server on 127.0.0.1 (this machine plays the host board).

Skipped only where /usr/sbin/sshd is absent (.ci/run installs openssh-server).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path

import pytest
from flash_support import SSHD, Sshd, digits_build, digits_bundle
from typer.testing import CliRunner

from edgekit import results
from edgekit.bundle import make_bundle
from edgekit.cli import app
from edgekit.flash import STAGING_MARK, FlashError, flash
from edgekit.fsutil import sha256_file
from edgekit.transports.base import HostKeyError, TransportError
from edgekit.transports.ssh import SSHTransport

pytestmark = pytest.mark.skipif(not Path(SSHD).exists(), reason="OpenSSH server not installed (apt-get install openssh-server)")


@pytest.fixture(autouse=True)
def _no_db_override():
    """The CLI's --results-db sets a process-wide override: reset it around every test."""
    results.use_db(None)
    yield
    results.use_db(None)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


def _ssh(sshd: Sshd, **kw) -> SSHTransport:
    kw.setdefault("known_hosts", str(sshd.known_hosts))
    return SSHTransport("127.0.0.1", user=sshd.user, port=sshd.port, key=str(sshd.user_key), **kw)


def _installed_ok(dest: Path, bundle: Path) -> bool:
    with tarfile.open(bundle) as tar:
        man = json.loads(tar.extractfile("manifest.json").read())
    return all(sha256_file(dest / rel) == info["sha256"] for rel, info in man["files"].items())


def _cli(*args: str):
    res = CliRunner().invoke(app, list(args))
    return res


def test_end_to_end_flash_and_smoke_over_ssh(sshd, tmp_path):
    """convert (digits, jetson target, host board) -> bundle -> flash over SSH -> smoke over SSH -> results."""
    db = tmp_path / "results.sqlite"
    build = digits_build()
    bundle = tmp_path / "digits.tar.gz"
    r = _cli("bundle", str(build), "-o", str(bundle), "--results-db", str(db))
    assert r.exit_code == 0, r.output
    dest = tmp_path / "board" / "digits"
    common = ["--host", sshd.address, "--key", str(sshd.user_key), "--known-hosts", str(sshd.known_hosts),
              "--dest", str(dest), "--results-db", str(db)]
    t0 = time.perf_counter()
    r = _cli("flash", str(bundle), "--board", "host", *common)
    t_flash = time.perf_counter() - t0
    assert r.exit_code == 0, r.output
    assert "every sha256 verified on the board" in r.output
    assert _installed_ok(dest, bundle) and not Path(f"{dest}.staging").exists()
    assert os.access(dest / "build_engine.sh", os.X_OK)  # scripts stay executable on the board
    t1 = time.perf_counter()
    r = _cli("smoke", str(bundle), *common, "--python", sys.executable)
    t_smoke = time.perf_counter() - t1
    assert r.exit_code == 0, r.output
    assert "[edgekit-smoke] PASS golden" in r.output  # streamed from the board
    for check in ("integrity", "golden", "latency", "memory"):
        assert any(ln.split()[:3] == ["│", check, "│"] and "pass" in ln for ln in r.output.splitlines()), (check, r.output)
    assert "not measured" in r.output  # power: no INA3221 rails here, never invented
    print(f"\nloopback SSH: flash {t_flash:.2f} s, smoke {t_smoke:.2f} s (digits int8 bundle)")

    results.use_db(db)
    try:
        ev = results.events()
        assert [e["kind"] for e in ev] == ["smoke", "flash", "bundle"]
        smoke_ev = ev[0]
        assert smoke_ev["passed"] is True and smoke_ev["board_id"] == "host/host"
        assert smoke_ev["host"] == f"{sshd.user}@127.0.0.1:{sshd.port}"
        man = json.loads((build / "manifest.json").read_text())
        assert smoke_ev["model_sha256"] == man["source_model"]["sha256"]
        m = results.measurements("host/host")
        assert len(m) == 1 and 0 < m[0]["measured_latency_ms"] < 100 and m[0]["precision"] == "int8"
    finally:
        results.use_db(None)
    r = _cli("results", "--results-db", str(db), "--json")
    assert r.exit_code == 0 and len(json.loads(r.output)) == 3


def test_convert_is_recorded(tmp_path, monkeypatch):
    """The convert hook in pipeline.convert() writes one 'convert' event."""
    from edgekit.pipeline import convert

    db = tmp_path / "c.sqlite"
    monkeypatch.setenv(results.ENV, str(db))
    d = Path(__file__).resolve().parents[1] / "examples" / "digits"
    convert(d / "digits_cnn.pt2", target="jetson", board="host", precision="fp32", out=tmp_path / "b", golden_count=4)
    results.use_db(None)
    ev = results.events("convert")
    assert len(ev) == 1 and ev[0]["precision"] == "fp32" and ev[0]["passed"] is True and ev[0]["board_id"] == "host/host"


def test_unknown_host_key_refused_without_flag(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    with pytest.raises(HostKeyError, match="not in .*accept-new-host-key"):
        _ssh(sshd, known_hosts=str(kh))
    assert not kh.exists()
    # CLI: refused, exit 2, one line, nothing written on the board
    dest = tmp_path / "board" / "digits"
    res = _cli("flash", str(digits_bundle()), "--host", sshd.address, "--key", str(sshd.user_key),
               "--known-hosts", str(kh), "--dest", str(dest))
    assert isinstance(res.exception, HostKeyError) and not dest.parent.exists()
    with _ssh(sshd, known_hosts=str(kh), accept_new_host_key=True) as t:
        assert t.run(["echo", "hi"]) == (0, "hi\n")
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in kh.read_text()
    with _ssh(sshd, known_hosts=str(kh)) as t:  # now known: no flag needed
        assert t.run(["true"])[0] == 0


def test_changed_host_key_refused_even_with_flag(sshd, tmp_path):
    import subprocess

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kt, kb = other.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kt} {kb}\n")
    with pytest.raises(HostKeyError, match="CHANGED"):
        _ssh(sshd, known_hosts=str(kh), accept_new_host_key=True)


def test_commands_are_quoted_not_shell_interpreted(sshd, tmp_path):
    marker = tmp_path / "pwned"
    with _ssh(sshd) as t:
        rc, out = t.run(["echo", f"a; touch {marker}", "$(id)", "`id`", "*"])
    assert rc == 0 and out == f"a; touch {marker} $(id) `id` *\n"
    assert not marker.exists()


def _big_bundle(tmp_path: Path) -> Path:
    """The digits build plus a 3 MB data file, so a cut lands in the middle of a file."""
    build = tmp_path / "big-build"
    shutil.copytree(digits_build(), build)
    (build / "weights_extra.bin").write_bytes(os.urandom(3 << 20))
    man = json.loads((build / "manifest.json").read_text())
    man["files"]["weights_extra.bin"] = {"sha256": sha256_file(build / "weights_extra.bin"), "bytes": 3 << 20}
    (build / "manifest.json").write_text(json.dumps(man, indent=2))
    path, _ = make_bundle(build, tmp_path / "big.tar.gz")
    return path


@pytest.mark.parametrize("how", ["close-transport", "kill-sshd"])
def test_cut_mid_upload_then_resume(sshd, tmp_path, how):
    bundle = _big_bundle(tmp_path)
    dest = tmp_path / "board" / "digits"
    staging = Path(f"{dest}.staging")
    t = _ssh(sshd)
    cut = {}

    def on_file(rel, size):
        def progress(done):
            if rel == "weights_extra.bin" and done >= 256 * 1024 and not cut:
                cut["at"] = done
                if how == "close-transport":
                    t.drop()
                else:
                    sshd.stop()
        return progress

    try:
        with pytest.raises(TransportError, match="lost .*run the same command again"):
            flash(bundle, t, dest=str(dest), on_file=on_file)
    finally:
        t.close()
        if sshd.proc is None:
            sshd.start()
    assert cut and not dest.exists()  # nothing installed by the failed run
    big = staging / "weights_extra.bin"
    assert staging.is_dir() and (not big.exists() or big.stat().st_size < 3 << 20)  # cut mid-file
    before = sorted(p.name for p in staging.iterdir() if p.name < "weights_extra.bin" and p.name != STAGING_MARK)
    with _ssh(sshd) as t2:
        res = flash(bundle, t2, dest=str(dest))
    assert set(res.skipped) == set(before) and before  # verified files were not sent again
    assert "weights_extra.bin" in res.uploaded and res.uploaded[-1] == "manifest.json"
    assert _installed_ok(dest, bundle) and not staging.exists()


class CorruptingSSHTransport(SSHTransport):
    """Real SSH; after uploading ``victim`` it flips one byte of it on the board (bad storage / transfer)."""

    victim = "model.onnx"

    def put(self, local, remote, progress=None):
        super().put(local, remote, progress)
        if remote.endswith("/" + self.victim):
            flip = "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[100]^=0xFF; open(p,'wb').write(b)"
            self.check(["python3", "-c", flip, remote], "corrupting")


def test_file_corrupted_on_device_is_caught_by_hash(sshd, tmp_path):
    bundle = digits_bundle()
    dest = tmp_path / "board" / "digits"
    t = CorruptingSSHTransport("127.0.0.1", user=sshd.user, port=sshd.port, key=str(sshd.user_key),
                               known_hosts=str(sshd.known_hosts))
    with t, pytest.raises(FlashError, match="sha256 on .* differs for model.onnx"):
        flash(bundle, t, dest=str(dest))
    assert not dest.exists()  # never installed
    with _ssh(sshd) as t2:  # rerun: only the bad file is sent again
        res = flash(bundle, t2, dest=str(dest))
        assert res.uploaded == ["model.onnx"]
        assert _installed_ok(dest, bundle)
        # corrupt the INSTALLED copy: smoke's integrity check fails, flash repairs just that file
        p = dest / "golden.npz"
        data = bytearray(p.read_bytes())
        data[-1] ^= 0xFF
        p.write_bytes(bytes(data))
        common = ["--host", sshd.address, "--key", str(sshd.user_key), "--known-hosts", str(sshd.known_hosts),
                  "--dest", str(dest), "--results-db", str(tmp_path / "r.sqlite")]
        r = _cli("smoke", str(bundle), *common, "--python", sys.executable)
        assert r.exit_code == 1 and "golden.npz: sha256 differs" in r.output, r.output
        res = flash(bundle, t2, dest=str(dest))
        assert res.uploaded == ["golden.npz"] and _installed_ok(dest, bundle)
        r = _cli("smoke", str(bundle), *common, "--python", sys.executable)
        assert r.exit_code == 0, r.output
