"""The transport interface, and the address parser that picks one.

Every command is an argv list. Transports that must go through a remote shell (ssh,
adb) join it with :func:`shlex.join`, so no user-supplied string is ever interpreted by
that shell. Paths on the device are POSIX strings.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgekit.errors import EdgekitError

Progress = Callable[[int], None]  # called with the bytes sent so far for one file
OnLine = Callable[[str], None]


class TransportError(EdgekitError):
    """The board cannot be reached, or a transfer or command on it failed."""


class HostKeyError(TransportError):
    """The board's SSH host key is unknown or has changed."""


@dataclass
class Address:
    kind: str  # "ssh" | "adb" | "local"
    host: str = ""
    user: str | None = None
    port: int | None = None
    serial: str | None = None


def parse_address(text: str) -> Address:
    """``local`` | ``adb`` | ``adb:SERIAL`` | ``[user@]host[:port]`` (``[v6]:port`` too)."""
    text = text.strip()
    if text in ("local", "localhost-local"):
        return Address("local")
    if text == "adb" or text.startswith("adb:"):
        return Address("adb", serial=text[4:] or None)
    user, _, hostport = text.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            port = rest[1:]
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    if not host or (port is not None and not port.isdigit()):
        raise TransportError(f"cannot read host {text!r}: give user@host, user@host:port, local, or adb[:SERIAL]")
    return Address("ssh", host=host, user=user or None, port=int(port) if port else None)


class Transport:
    """Run commands on a board and move files to and from it.

    Subclasses implement :meth:`run`, :meth:`put` and :meth:`get`; the rest has
    command-based defaults (coreutils / toybox) that a subclass may replace.
    """

    name = "base"

    # -- required
    def run(self, argv: Sequence[str], on_line: OnLine | None = None, timeout: float | None = None) -> tuple[int, str]:
        """Run ``argv`` on the board; returns (exit code, stdout+stderr). Streams lines to ``on_line``."""
        raise NotImplementedError

    def put(self, local: str, remote: str, progress: Progress | None = None) -> None:
        raise NotImplementedError

    def get(self, remote: str) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- defaults built on run()
    def check(self, argv: Sequence[str], what: str) -> str:
        rc, out = self.run(argv)
        if rc != 0:
            raise TransportError(f"{what} failed on {self.describe()} (exit {rc}): {out.strip()[-400:]}")
        return out

    def describe(self) -> str:
        return self.name

    def home(self) -> str:
        return self.check(["printenv", "HOME"], "reading $HOME").strip() or "/"

    def resolve(self, path: str) -> str:
        """``~`` and relative paths resolved against the board user's home."""
        if path == "~" or path.startswith("~/"):
            path = self.home() + path[1:]
        elif not path.startswith("/"):
            path = posixpath.join(self.home(), path)
        return posixpath.normpath(path)

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path])[0] == 0

    def makedirs(self, path: str) -> None:
        self.check(["mkdir", "-p", "--", path], f"mkdir {path}")

    def rename(self, src: str, dst: str) -> None:
        self.check(["mv", "--", src, dst], f"rename {src}")  # dst never exists here (flash moves it aside)

    def remove_tree(self, path: str) -> None:
        self.check(["rm", "-rf", "--", path], f"remove {path}")

    def copy_file(self, src: str, dst: str) -> None:
        self.check(["cp", "-p", "--", src, dst], f"copy {src}")

    def remove(self, path: str) -> None:
        self.check(["rm", "-f", "--", path], f"remove {path}")

    def is_dir(self, path: str) -> bool:
        """A real folder (not a link to one)."""
        return self.run(["sh", "-c", '[ -d "$1" ] && [ ! -L "$1" ]', "sh", path])[0] == 0

    def list_entries(self, root: str) -> list[str]:
        """Everything under ``root`` that is not a folder (files, links, fifos ...), relative to it."""
        rc, out = self.run(["find", root, "-mindepth", "1", "!", "-type", "d"])
        if rc != 0:
            return []
        pre = root.rstrip("/") + "/"
        return sorted(ln[len(pre):] for ln in out.splitlines() if ln.startswith(pre))

    def list_files(self, root: str) -> list[str]:
        """Regular files under ``root``, as paths relative to it."""
        rc, out = self.run(["find", root, "-type", "f"])
        if rc != 0:
            return []
        pre = root.rstrip("/") + "/"
        return sorted(ln[len(pre):] for ln in out.splitlines() if ln.startswith(pre))

    def sha256(self, paths: Sequence[str]) -> dict[str, str | None]:
        """sha256 of each path computed ON the board (None where missing or unreadable)."""
        out: dict[str, str | None] = {p: None for p in paths}
        if not paths:
            return out
        # non-zero when some file is missing; its complaint goes to stderr, which transports merge into
        # the output: keep it out so that it can never split a digest line
        _rc, text = self.run(["sh", "-c", 'sha256sum -- "$@" 2>/dev/null', "sh", *paths])
        for line in text.splitlines():
            digest, sep, name = line.partition("  ")
            if sep and name in out and len(digest) == 64:
                out[name] = digest
        return out


def quote(argv: Sequence[str]) -> str:
    """One POSIX-shell command line from an argv list, every word quoted."""
    return shlex.join([str(a) for a in argv])


def open_transport(
    host: str,
    key: str | None = None,
    known_hosts: str | None = None,
    accept_new_host_key: bool = False,
    adb_server: str | None = None,
    timeout: float = 15.0,
) -> Transport:
    """Open the transport an address names (see :func:`parse_address`)."""
    addr = parse_address(host)
    if addr.kind == "local":
        from edgekit.transports.local import LocalTransport

        return LocalTransport()
    if addr.kind == "adb":
        from edgekit.transports.adb import AdbTransport

        return AdbTransport(serial=addr.serial, server=adb_server)
    from edgekit.transports.ssh import SSHTransport

    return SSHTransport(addr.host, user=addr.user, port=addr.port or 22, key=key, known_hosts=known_hosts,
                        accept_new_host_key=accept_new_host_key, timeout=timeout)
