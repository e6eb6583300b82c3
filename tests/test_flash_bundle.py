"""Bundle packing and safe unpacking, and flash/smoke through the local transport."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import tarfile
import time
from pathlib import Path

import pytest
from flash_support import bundle_file_count, digits_build, digits_bundle

from edgekit.bundle import BundleError, make_bundle, unpack
from edgekit.flash import STAGING_MARK, FlashError, flash
from edgekit.fsutil import sha256_file
from edgekit.smoke import smoke
from edgekit.transports.local import LocalTransport


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _link(name: str, target: str, hard: bool = False) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
    info.linkname = target
    return info, None


def _evil(tmp_path: Path, extra) -> Path:
    """A real digits bundle plus one hostile member (placed first so it is met early)."""
    members = [extra]
    with tarfile.open(digits_bundle()) as good:
        for m in good.getmembers():
            members.append((m, good.extractfile(m).read()))
    return _tar(tmp_path / "evil.tar.gz", members)


def test_bundle_roundtrip_is_deterministic(tmp_path):
    build = digits_build()
    a, man = make_bundle(build, tmp_path / "a.tar.gz")
    time.sleep(1.1)  # packed in another second: nothing in the archive (gzip's header time included) says when
    b, _ = make_bundle(build, tmp_path / "b.tar.gz")
    assert sha256_file(a) == sha256_file(b)
    with tarfile.open(a) as tar:
        assert sorted(tar.getnames()) == sorted(["manifest.json", *man.files])
    with unpack(a) as ub:
        assert ub.manifest.name == man.name
        for rel, info in man.files.items():
            assert sha256_file(ub.root / rel) == info.sha256
        root = ub.root
    assert not root.exists()  # temporary unpack folder removed


def test_bundle_refuses_failed_verification(tmp_path):
    build = tmp_path / "build"
    shutil.copytree(digits_build(), build)
    man = json.loads((build / "manifest.json").read_text())
    man["verification"]["passed"] = False
    man["verification"]["failures"] = ["output: max rel error 40% > 15%"]
    (build / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(BundleError, match="verification failed.*40%"):
        make_bundle(build, tmp_path / "x.tar.gz")
    assert not (tmp_path / "x.tar.gz").exists()


def test_bundle_refuses_tampered_build(tmp_path):
    build = tmp_path / "build"
    shutil.copytree(digits_build(), build)
    with open(build / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match="model.onnx: sha256 differs"):
        make_bundle(build, tmp_path / "x.tar.gz")


@pytest.mark.parametrize("extra, why", [
    (_file("../escaped.txt"), "climbs out"),
    (_file("sub/../../escaped.txt"), "climbs out"),
    (_file("/tmp/edgekit-abs-escaped.txt"), "absolute path"),
    (_link("evil_link", "../../../etc/passwd"), "outside the bundle"),
    (_link("evil_link", "/etc/passwd"), "outside the bundle"),
    (_link("evil_hard", "../escaped.txt", hard=True), "climbs out"),
])
def test_unpack_rejects_escaping_members_before_writing(tmp_path, extra, why):
    bundle = _evil(tmp_path, extra)
    dest = tmp_path / "out" / "unpacked"
    with pytest.raises(BundleError, match=why):
        unpack(bundle, dest)
    assert not dest.exists()
    assert not (tmp_path / "out" / "escaped.txt").exists() and not Path("/tmp/edgekit-abs-escaped.txt").exists()
    # and flash refuses it before touching the board
    board = tmp_path / "board"
    with pytest.raises(BundleError, match=why):
        flash(bundle, LocalTransport(), dest=str(board / "digits"))
    assert not board.exists()


def test_unpack_rejects_fifo_and_unlisted_and_corrupt(tmp_path):
    fifo = tarfile.TarInfo("pipe")
    fifo.type = tarfile.FIFOTYPE
    with pytest.raises(BundleError, match="device or fifo"):
        unpack(_evil(tmp_path, (fifo, None)))
    with pytest.raises(BundleError, match="does not list.*stowaway.sh"):
        unpack(_evil(tmp_path, _file("stowaway.sh", b"rm -rf ~\n")))
    # same names, one file's bytes changed: caught by the manifest's sha256, nothing left behind
    members = []
    with tarfile.open(digits_bundle()) as good:
        for m in good.getmembers():
            data = good.extractfile(m).read()
            members.append((m, data.replace(b"edgekit", b"EDGEKIT") if m.name == "run.py" else data))
    dest = tmp_path / "corrupt-out"
    with pytest.raises(BundleError, match="run.py: sha256 differs"):
        unpack(_tar(tmp_path / "c.tar.gz", members), dest)
    assert not dest.exists()


def test_internal_symlink_is_allowed(tmp_path):
    with unpack(_evil(tmp_path, _link("docs/readme-link", "../report.md"))) as ub:
        assert (ub.root / "docs" / "readme-link").resolve() == (ub.root / "report.md").resolve()


def test_flash_and_smoke_local_transport(tmp_path):
    """The host board through the local transport: flash, re-flash (nothing sent), smoke."""
    dest = str(tmp_path / "board" / "digits")
    t = LocalTransport()
    r1 = flash(digits_bundle(), t, dest=dest)
    assert len(r1.uploaded) == bundle_file_count() and not r1.skipped and not Path(dest + ".staging").exists()
    r2 = flash(digits_bundle(), t, dest=dest)
    assert r2.already_installed and not r2.uploaded
    # a staging folder left by an interrupted run of ANOTHER bundle: stray files go, good ones are kept
    shutil.rmtree(dest)
    Path(dest + ".staging").mkdir()
    (Path(dest + ".staging") / "stray.bin").write_bytes(b"from another bundle")
    shutil.copy(digits_build() / "run.py", dest + ".staging/run.py")
    # without edgekit's staging mark the folder is not edgekit's: refused, nothing in it touched
    with pytest.raises(FlashError, match="edgekit did not make it"):
        flash(digits_bundle(), t, dest=dest)
    assert (Path(dest + ".staging") / "stray.bin").exists()
    (Path(dest + ".staging") / STAGING_MARK).write_text("edgekit staging folder\n")  # as an interrupted flash leaves it
    r3 = flash(digits_bundle(), t, dest=dest)
    assert r3.skipped == ["run.py"] and len(r3.uploaded) == bundle_file_count() - 1 and not (Path(dest) / "stray.bin").exists()
    s = smoke(digits_bundle(), t, dest=dest, python=sys.executable)
    names = {c["name"]: c["passed"] for c in s.checks}
    assert s.passed, s.result
    assert names["integrity"] and names["golden"] and names["latency"] and names["power"] is None
    assert s.latency_p50_ms and s.latency_p50_ms > 0


def test_cli_bundle_flash_smoke_results_local(tmp_path):
    """The CLI path on the host board: no --host means the local transport."""
    from typer.testing import CliRunner

    from edgekit import results
    from edgekit.cli import app

    db, dest, out = tmp_path / "r.sqlite", tmp_path / "board" / "digits", tmp_path / "d.tar.gz"
    run = CliRunner().invoke
    try:
        r = run(app, ["bundle", str(digits_build()), "-o", str(out), "--results-db", str(db)])
        # bundle and smoke count the same files: those the manifest lists (and hashes), the manifest beside them
        listed = bundle_file_count() - 1
        assert r.exit_code == 0 and f" {listed} files + manifest.json" in r.output, r.output
        assert re.search(r"\([\d,]+(\.\d)? (B|KB|MB|GB): ", r.output), r.output  # the one size format
        r = run(app, ["flash", str(out), "--board", "host", "--dest", str(dest), "--results-db", str(db)])
        assert r.exit_code == 0 and "(local)" in r.output and f"{bundle_file_count()} sent" in r.output, r.output
        # no --python: on the host board the smoke test runs in the Python edgekit runs in (the README's path)
        r = run(app, ["smoke", str(out), "--dest", str(dest), "--results-db", str(db), "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["passed"] is True
        integrity = next(c for c in json.loads(r.output)["checks"] if c["name"] == "integrity")
        assert integrity["detail"] == f"all {listed} files the manifest lists match their sha256", integrity
        r = run(app, ["results", "--results-db", str(db), "--kind", "smoke"])
        assert r.exit_code == 0 and "smoke" in r.output and "bundle" not in r.output.split("results:")[1].split("\n", 1)[1]
        r = run(app, ["flash", str(out), "--board", "nvidia/jetson-orin-nano-8gb", "--results-db", str(db)])
        assert r.exit_code != 0 and "built for board host/host" in str(r.exception)
    finally:
        results.use_db(None)


def test_cli_flash_and_smoke_unpack_the_bundle_once(tmp_path, monkeypatch):
    """Reading the manifest must not cost a second extraction and sha256 pass over the whole bundle."""
    from typer.testing import CliRunner

    import edgekit.bundle
    from edgekit import results
    from edgekit.cli import app

    calls = []
    real = edgekit.bundle.unpack

    def counting_unpack(*a, **kw):  # the real unpack, counted
        calls.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(edgekit.bundle, "unpack", counting_unpack)
    db, dest = tmp_path / "r.sqlite", tmp_path / "board" / "digits"
    try:
        r = CliRunner().invoke(app, ["flash", str(digits_bundle()), "--dest", str(dest), "--results-db", str(db)])
        assert r.exit_code == 0 and f"{bundle_file_count()} sent" in r.output, r.output
        assert len(calls) == 1
        r = CliRunner().invoke(app, ["smoke", str(digits_bundle()), "--dest", str(dest), "--python", sys.executable,
                                     "--results-db", str(db), "--json"])
        assert r.exit_code == 0 and json.loads(r.output)["passed"] is True, r.output
        assert len(calls) == 2
    finally:
        results.use_db(None)


@pytest.mark.parametrize("text, want", [
    ("local", ("local", "", None, None, None)),
    ("adb", ("adb", "", None, None, None)),
    ("adb:R58M123", ("adb", "", None, None, "R58M123")),
    ("nvidia@10.0.0.7", ("ssh", "10.0.0.7", "nvidia", None, None)),
    ("root@10.0.0.7:2222", ("ssh", "10.0.0.7", "root", 2222, None)),
    ("jetson.local", ("ssh", "jetson.local", None, None, None)),
    ("u@[fe80::1]:22", ("ssh", "fe80::1", "u", 22, None)),
])
def test_parse_address(text, want):
    from edgekit.transports.base import parse_address

    a = parse_address(text)
    assert (a.kind, a.host, a.user, a.port, a.serial) == want


@pytest.mark.parametrize("text", ["root@", "root@host:abc", "u@[fe80::1]:x"])
def test_parse_address_rejects(text):
    from edgekit.transports.base import TransportError, parse_address

    with pytest.raises(TransportError, match="cannot read host"):
        parse_address(text)


def test_bundle_file_is_readable_like_any_new_file(tmp_path):
    """The bundle goes through a temporary sibling (mkstemp: 0600); it lands with the mode the user's umask gives."""
    import os
    import stat

    mask = os.umask(0o022)
    try:
        out, _ = make_bundle(digits_build(), tmp_path / "b.tar.gz")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
