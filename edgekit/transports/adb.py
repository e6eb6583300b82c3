"""adb transport (adbutils) for Android boards: shell commands and sync push/pull.

Talks to the adb server (default 127.0.0.1:5037, or ``--adb-server host:port`` / env
``ANDROID_ADB_SERVER_PORT``); the server must already run (``adb start-server``):
edgekit never starts one. Files go under /data/local/tmp, the folder ``adb shell`` can
write on a stock phone. Commands are argv lists quoted with :func:`shlex.join`; the exit
code comes back through a fixed marker line appended after the quoted command.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from edgekit.deps import require
from edgekit.transports.base import OnLine, Progress, Transport, TransportError, quote

RC_MARK = "__EDGEKIT_RC="
DEVICE_HOME = "/data/local/tmp"


class _Counting:
    """File wrapper that reports bytes read (adbutils' push has no progress callback)."""

    def __init__(self, path: str, progress: Progress | None) -> None:
        self.f, self.done, self.progress = open(path, "rb"), 0, progress

    def read(self, n: int = -1) -> bytes:
        b = self.f.read(n)
        self.done += len(b)
        if b and self.progress:
            self.progress(self.done)
        return b

    def close(self) -> None:
        self.f.close()


class AdbTransport(Transport):
    name = "adb"

    def __init__(self, serial: str | None = None, server: str | None = None, timeout: float = 15.0) -> None:
        adbutils = require("adbutils")
        host, port = "127.0.0.1", int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
        if server:
            h, _, p = server.rpartition(":")
            host, port = h or host, int(p)
        try:  # adbutils would spawn its bundled adb when nothing listens: refuse instead
            socket.create_connection((host, port), timeout=3).close()
        except OSError as exc:
            raise TransportError(f"no adb server at {host}:{port} ({exc}); start one with `adb start-server` "
                                 "(and accept the USB debugging prompt on the phone)") from None
        self._errors = (adbutils.AdbError, OSError, EOFError, socket.timeout)
        try:
            self.client = adbutils.AdbClient(host=host, port=port, socket_timeout=timeout)
            self.device = self.client.device(serial)
            self.serial = self.device.serial or serial or "?"
            state = self.device.get_state()
        except self._errors as exc:
            raise TransportError(f"adb cannot reach device {serial or '(the only one)'}: {exc}; "
                                 "check `adb devices`") from None
        if state != "device":
            raise TransportError(f"adb device {self.serial} is {state!r}, not ready; unlock it and accept USB debugging")

    def describe(self) -> str:
        return f"adb:{self.serial}"

    def home(self) -> str:
        return DEVICE_HOME

    def run(self, argv: Sequence[str], on_line: OnLine | None = None, timeout: float | None = None) -> tuple[int, str]:
        cmd = quote(argv) + f" 2>&1; echo {RC_MARK}$?"
        out, rc, buf = [], None, b""
        try:
            c = self.device.open_shell(cmd)
            try:
                if timeout:
                    c.conn.settimeout(timeout)
                while True:
                    data = c.conn.recv(32768)
                    if not data:
                        break
                    buf += data
                    *lines, buf = buf.split(b"\n")
                    for ln in lines:
                        text = ln.decode("utf-8", "replace").rstrip("\r")
                        if text.startswith(RC_MARK):
                            rc = int(text[len(RC_MARK):])
                            continue
                        out.append(text + "\n")
                        if on_line:
                            on_line(text)
            finally:
                c.close()
        except self._errors as exc:
            raise TransportError(f"adb connection to {self.describe()} lost ({exc}); run the command again") from None
        if buf:
            text = buf.decode("utf-8", "replace")
            if text.startswith(RC_MARK):
                rc = int(text[len(RC_MARK):])
            else:
                out.append(text)
        if rc is None:
            raise TransportError(f"adb shell on {self.describe()} ended without an exit code (connection dropped?)")
        return rc, "".join(out)

    def put(self, local: str, remote: str, progress: Progress | None = None) -> None:
        src = _Counting(local, progress)
        try:
            self.device.sync.push(src, remote, mode=0o755 if local.endswith((".sh", ".py")) else 0o644)
        except self._errors as exc:
            raise TransportError(f"adb push of {os.path.basename(local)} to {self.describe()} failed ({exc}); "
                                 "run flash again to resume") from None
        finally:
            src.close()

    def get(self, remote: str) -> bytes:
        try:
            return self.device.sync.read_bytes(remote)
        except self._errors as exc:
            raise TransportError(f"adb pull of {remote} from {self.describe()} failed ({exc})") from None
