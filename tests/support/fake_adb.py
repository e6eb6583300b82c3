"""FakeAdbServer: a stand-in for the adb server AND one phone, for tests only.

No phone can be reached here, so this speaks the part of the adb host protocol that
adbutils uses for shell and push/pull (host:version, host:devices, host:transport:,
host-serial:...:get-state, shell:, sync: STAT/SEND/RECV/QUIT) and plays the device by
running shell commands with this machine's /bin/sh and reading/writing this machine's
files. It proves edgekit's adb transport speaks the protocol; it proves nothing about
Android (toybox, SELinux, /data/local/tmp permissions): only a real phone can.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import subprocess
import threading
from pathlib import Path

SERIAL = "FAKE0001"


def _read_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _block(text: str) -> bytes:
    data = text.encode()
    return f"{len(data):04x}".encode() + data


class FakeAdbServer:
    def __init__(self, serial: str = SERIAL) -> None:
        self.serial = serial
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.commands: list[str] = []  # every host/service request seen, for assertions
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeAdbServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self.sock.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                transported = False
                while True:
                    n = int(_read_exact(conn, 4), 16)
                    req = _read_exact(conn, n).decode()
                    self.commands.append(req)
                    if req == "host:version":
                        conn.sendall(b"OKAY" + _block("0028"))  # protocol 40: plain host:transport
                        return
                    if req in ("host:devices", "host:devices-l"):
                        conn.sendall(b"OKAY" + _block(f"{self.serial}\tdevice\n"))
                        return
                    if req.startswith("host-serial:") and req.endswith(":get-state"):
                        ok = req.split(":")[1] == self.serial
                        conn.sendall(b"OKAY" + _block("device") if ok else b"FAIL" + _block("device not found"))
                        return
                    if req.startswith("host:transport:"):
                        if req.split(":", 2)[2] != self.serial:
                            conn.sendall(b"FAIL" + _block(f"device '{req[15:]}' not found"))
                            return
                        transported = True
                        conn.sendall(b"OKAY")
                        continue
                    if transported and req.startswith("shell:"):
                        conn.sendall(b"OKAY")
                        proc = subprocess.run(["/bin/sh", "-c", req[6:]], check=False, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, cwd="/")
                        conn.sendall(proc.stdout)
                        return
                    if transported and req == "sync:":
                        conn.sendall(b"OKAY")
                        self._sync(conn)
                        return
                    conn.sendall(b"FAIL" + _block(f"unsupported by FakeAdbServer: {req}"))
                    return
        except (EOFError, OSError):
            return

    def _sync(self, conn: socket.socket) -> None:
        while True:
            cmd = _read_exact(conn, 4)
            n = struct.unpack("<I", _read_exact(conn, 4))[0]
            arg = _read_exact(conn, n).decode()
            if cmd == b"STAT":
                try:
                    st = os.stat(arg)
                    conn.sendall(b"STAT" + struct.pack("<III", st.st_mode, st.st_size, int(st.st_mtime)))
                except OSError:
                    conn.sendall(b"STAT" + struct.pack("<III", 0, 0, 0))
            elif cmd == b"SEND":
                path, _, mode = arg.rpartition(",")
                data = bytearray()
                while True:
                    kind = _read_exact(conn, 4)
                    val = struct.unpack("<I", _read_exact(conn, 4))[0]
                    if kind == b"DATA":
                        data += _read_exact(conn, val)
                    elif kind == b"DONE":
                        break
                    else:
                        raise EOFError
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(bytes(data))
                os.chmod(path, stat.S_IMODE(int(mode)))
                conn.sendall(b"OKAY" + struct.pack("<I", 0))
            elif cmd == b"RECV":
                try:
                    data = Path(arg).read_bytes()
                except OSError as exc:
                    msg = str(exc).encode()
                    conn.sendall(b"FAIL" + struct.pack("<I", len(msg)) + msg)
                    continue
                for i in range(0, len(data), 64 * 1024):
                    chunk = data[i:i + 64 * 1024]
                    conn.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
                conn.sendall(b"DONE" + struct.pack("<I", 0))
            else:  # QUIT or anything else
                return
