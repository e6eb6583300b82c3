"""Shared helpers for tests/test_flash*.py: the digits build (converted once per session)
and a real OpenSSH server on 127.0.0.1 with throwaway keys."""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@functools.cache
def digits_build() -> Path:
    """The digits CNN converted for the jetson target on the host board, int8 (real toolchain)."""
    from edgekit import results
    from edgekit.pipeline import convert

    work = Path(tempfile.mkdtemp(prefix="edgekit-flash-build-"))
    old = os.environ.get(results.ENV)
    os.environ[results.ENV] = str(work / "convert-results.sqlite")
    try:
        convert(DIGITS / "digits_cnn.pt2", target="jetson", board="host", precision="int8",
                calib=str(DIGITS / "calib.npz"), out=work / "build")
    finally:
        if old is None:
            os.environ.pop(results.ENV, None)
        else:
            os.environ[results.ENV] = old
    return work / "build"


@functools.cache
def digits_bundle() -> Path:
    from edgekit.bundle import make_bundle

    build = digits_build()
    path, _ = make_bundle(build, build.parent / "digits.tar.gz")
    return path


def bundle_file_count() -> int:
    """Files a flash of the digits bundle sends: every file in its manifest, plus the manifest."""
    import json

    return len(json.loads((digits_build() / "manifest.json").read_text())["files"]) + 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """Debian's OpenSSH server on 127.0.0.1:<free port>, keys and config in ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.user = getpass.getuser()
        self.host_key = base / "ssh_host_ed25519_key"
        self.user_key = base / "id_ed25519"
        for k in (self.host_key, self.user_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
        (base / "authorized_keys").write_text(self.user_key.with_suffix(".pub").read_text())
        self.config = base / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\nPidFile {base / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {base / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\nLogLevel ERROR\n"
        )
        pub = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts = base / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation dir sshd insists on
        log = open(self.base / "sshd.log", "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log,
                                     start_new_session=True)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.base / 'sshd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        """Kill the listener and every session process it forked (SIGKILL: no goodbye to clients)."""
        if self.proc is None:
            return
        for pid in [self.proc.pid, *_descendants(self.proc.pid)]:  # sessions call setsid(): not in our group
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        self.proc = None


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            parent[int(d)] = int(stat.rpartition(")")[2].split()[1])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out
