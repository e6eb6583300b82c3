"""The fleet (edgekit.fleet, `edgekit fleet flash|smoke`): three boards on three REAL OpenSSH servers on loopback,
one of them killed mid-flash."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from flash_support import SSHD, Sshd, digits_bundle, free_port
from typer.testing import CliRunner

from edgekit import results
from edgekit.bundle import unpack
from edgekit.cli import app
from edgekit.fleet import FleetError, load_fleet, run_fleet
from edgekit.fsutil import sha256_file

needs_sshd = pytest.mark.skipif(not Path(SSHD).exists(), reason="OpenSSH server not installed")


@pytest.fixture(autouse=True)
def _no_db_override():
    results.use_db(None)
    yield
    results.use_db(None)


def _board(name: str, sshd: Sshd, dest: Path, tags: str = '["lab-a"]') -> str:
    return (f'[[boards]]\nname = "{name}"\nboard = "host"\ntransport = "ssh"\naddress = "{sshd.address}"\n'
            f'key = "{sshd.user_key}"\nknown_hosts = "{sshd.known_hosts}"\ndest = "{dest}"\n'
            f'python = "{sys.executable}"\ntags = {tags}\n')


def _installed_ok(dest: Path) -> bool:
    with unpack(digits_bundle()) as ub:
        return all((dest / rel).is_file() and sha256_file(dest / rel) == info.sha256
                   for rel, info in ub.manifest.files.items())


@pytest.fixture
def three(tmp_path):
    servers = []
    for i in range(3):
        (tmp_path / f"sshd{i}").mkdir()
        servers.append(Sshd(tmp_path / f"sshd{i}"))
        servers[-1].start()
    dests = [tmp_path / f"board{i}" / "digits" for i in range(3)]
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n".join(_board(f"b{i}", s, d) for i, (s, d) in enumerate(zip(servers, dests, strict=True)))
                     + '\n[[boards]]\nname = "elsewhere"\nboard = "host"\ntransport = "local"\ntags = ["lab-b"]\n')
    yield servers, dests, fleet
    for s in servers:
        s.stop()


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
@needs_sshd
def test_one_board_killed_mid_flash_the_others_finish_and_a_rerun_resumes_it(three, tmp_path):
    servers, dests, fleet_file = three
    fleet = load_fleet(fleet_file)
    started: list[str] = []

    def on_file(board: str, rel: str, size: int):
        if board != "b1":
            return None
        started.append(rel)
        if len(started) == 3:  # b1's sshd dies as its third file starts: two files are staged
            servers[1].stop()
        return None

    with unpack(digits_bundle()) as ub:
        outs = run_fleet("flash", [ub], fleet, tags=["lab-a"], max_parallel=3, timeout=120, retries=0,
                         on_file=on_file)
    by = {o.board.name: o for o in outs}
    assert set(by) == {"b0", "b1", "b2"}  # the lab-b board is not selected
    assert by["b0"].passed and by["b2"].passed and _installed_ok(dests[0]) and _installed_ok(dests[2])
    bad = by["b1"]
    assert not bad.passed and bad.attempts == 1
    assert "lost" in bad.reason and "\n" not in bad.reason, bad.reason  # one line, naming what happened
    assert not dests[1].exists() and Path(f"{dests[1]}.staging").is_dir()  # nothing half-installed

    servers[1].start()  # the board is back: the same command again
    db = tmp_path / "results.sqlite"
    r = CliRunner().invoke(app, ["fleet", "flash", str(digits_bundle()), "--fleet", str(fleet_file), "--tag", "lab-a",
                                 "--retries", "0", "--results-db", str(db)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "3 of 3 boards passed" in r.output
    assert _installed_ok(dests[1]) and not Path(f"{dests[1]}.staging").exists()
    results.use_db(db)
    ev = {e["fleet_board"]: e for e in results.events("flash")}
    assert set(ev) == {"b0", "b1", "b2"} and all(e["passed"] for e in ev.values())
    assert set(started[:2]) <= set(ev["b1"]["skipped"]) and not set(started[:2]) & set(ev["b1"]["uploaded"])  # resumed
    assert ev["b0"]["uploaded"] == [] and ev["b2"]["uploaded"] == []  # already installed: nothing sent

    r = CliRunner().invoke(app, ["fleet", "smoke", str(digits_bundle()), "--fleet", str(fleet_file), "--tag", "lab-a",
                                 "--results-db", str(db)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    smokes = results.events("smoke")
    assert sorted(e["fleet_board"] for e in smokes) == ["b0", "b1", "b2"]
    assert all(e["passed"] and e["board_id"] == "host/host" and e["measured_latency_ms"] for e in smokes)


def test_an_unreachable_board_is_retried_and_reported_while_the_others_pass(tmp_path):
    dead = free_port()  # nothing listens there
    fleet_file = tmp_path / "fleet.toml"
    fleet_file.write_text(
        f'[[boards]]\nname = "gone"\nboard = "host"\naddress = "nobody@127.0.0.1:{dead}"\n\n'
        f'[[boards]]\nname = "here"\nboard = "host"\ntransport = "local"\ndest = "{tmp_path / "here" / "digits"}"\n')
    db = tmp_path / "r.sqlite"
    r = CliRunner().invoke(app, ["fleet", "flash", str(digits_bundle()), "--fleet", str(fleet_file), "--retries", "1",
                                 "--timeout", "30", "--results-db", str(db)], env={"COLUMNS": "200"})
    assert r.exit_code == 1, r.output  # one board failed: the command fails
    assert "1 of 2 boards passed" in r.output and _installed_ok(tmp_path / "here" / "digits")
    results.use_db(db)
    ev = {e["fleet_board"]: e for e in results.events("flash")}
    assert ev["here"]["passed"] and not ev["gone"]["passed"] and "127.0.0.1" in ev["gone"]["reason"]
    with unpack(digits_bundle()) as ub:
        (gone,) = [o for o in run_fleet("flash", [ub], load_fleet(fleet_file), retries=1) if o.board.name == "gone"]
    assert gone.attempts == 2 and not gone.passed


@pytest.mark.parametrize("text, match", [
    ('[[boards]]\nname = "a"\nboard = "host"\naddres = "x@y"\n', "boards.0.addres: Extra inputs are not permitted"),
    ('[[boards]]\nname = "a"\nboard = "host"\n', "an ssh board needs address"),
    ('[[boards]]\nname = "a"\nboard = "nope/nope"\ntransport = "local"\n', "board 'a': unknown board 'nope/nope'"),
    ('[[boards]]\nname = "a"\nboard = "host"\ntransport = "local"\n' * 2, "repeated: a"),
    ('[[boards]]\nname = "a"\nboard = "host"\ntransport = "serial"\n', "boards.0.transport"),
    ("boards = [", "not valid TOML"),
])
def test_fleet_file_errors_are_one_line(tmp_path, text, match):
    f = tmp_path / "fleet.toml"
    f.write_text(text)
    with pytest.raises(FleetError, match=match) as exc:
        load_fleet(f)
    assert "\n" not in str(exc.value)


def test_no_board_with_the_tag_and_no_bundle_for_the_boards_are_refused(tmp_path):
    f = tmp_path / "fleet.toml"
    f.write_text('[[boards]]\nname = "a"\nboard = "nvidia/jetson-orin-nano-8gb"\naddress = "u@h"\ntags = ["x"]\n')
    with unpack(digits_bundle()) as ub:
        with pytest.raises(FleetError, match="no board of the fleet carries the tag"):
            run_fleet("smoke", [ub], load_fleet(f), tags=["lab-z"])
        with pytest.raises(FleetError, match="the bundles are for host/host"):
            run_fleet("smoke", [ub], load_fleet(f))


@needs_sshd
def test_a_board_that_hangs_is_cut_at_the_timeout(tmp_path):
    (tmp_path / "sshd").mkdir()
    server = Sshd(tmp_path / "sshd")
    server.start()
    try:
        hang = tmp_path / "hanging-python"
        hang.write_text("#!/bin/sh\nsleep 120\n")  # the board's runner never answers
        hang.chmod(0o755)
        f = tmp_path / "fleet.toml"
        f.write_text(_board("slow", server, tmp_path / "board" / "digits").replace(sys.executable, str(hang)))
        with unpack(digits_bundle()) as ub:
            assert run_fleet("flash", [ub], load_fleet(f), retries=0)[0].passed
            t0 = time.perf_counter()
            (o,) = run_fleet("smoke", [ub], load_fleet(f), timeout=3, retries=0)
        assert time.perf_counter() - t0 < 60 and not o.passed
        assert o.reason.startswith("timed out after 3 s") and "\n" not in o.reason, o.reason
    finally:
        server.stop()
