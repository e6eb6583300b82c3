"""SSH transport (paramiko): commands over exec, files over SFTP.

Host keys are checked against a known_hosts file (default ``~/.ssh/known_hosts``). An
unknown host is refused unless ``accept_new_host_key`` is set, which then records its
key there (OpenSSH's ``StrictHostKeyChecking=accept-new``); a host whose key CHANGED is
always refused. Commands are argv lists joined with :func:`shlex.join`.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from edgekit.deps import require
from edgekit.transports.base import HostKeyError, OnLine, Progress, Transport, TransportError, quote


def fingerprint(key) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SSHTransport(Transport):
    name = "ssh"

    def __init__(self, host: str, user: str | None = None, port: int = 22, key: str | None = None,
                 known_hosts: str | None = None, accept_new_host_key: bool = False, timeout: float = 15.0) -> None:
        paramiko = require("paramiko")
        self.host, self.port, self.user = host, port, user or os.environ.get("USER") or "root"
        self.known_hosts = Path(known_hosts or "~/.ssh/known_hosts").expanduser()
        self._paramiko = paramiko
        self._sftp = None
        self._home: str | None = None
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_AcceptNew(self.known_hosts) if accept_new_host_key else _Refuse(self.known_hosts))
        try:
            client.connect(host, port=port, username=self.user, key_filename=str(Path(key).expanduser()) if key else None,
                           timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                           allow_agent=key is None, look_for_keys=key is None)
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"the host key of {self.describe()} CHANGED (now {fingerprint(exc.key)}, {self.known_hosts} has "
                f"{fingerprint(exc.expected_key)}): possible man-in-the-middle; if the board was reinstalled, "
                f"remove the old key with `ssh-keygen -f {self.known_hosts} -R {self._kh_name()}` and connect again"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise TransportError(f"{self.describe()} refused the login ({exc}); give the right user and --key FILE") from None
        except (TimeoutError, OSError, paramiko.SSHException, EOFError) as exc:
            client.close()
            raise TransportError(f"cannot connect to {self.describe()}: {exc}; is the board up and sshd listening?") from None
        self.client = client

    def _kh_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def describe(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def _lost(self, exc: BaseException, what: str) -> TransportError:
        return TransportError(f"connection to {self.describe()} lost during {what} ({type(exc).__name__}: {exc}); "
                              "run the same command again: flashing resumes where it stopped")

    @property
    def sftp(self):
        if self._sftp is None:
            try:
                self._sftp = self.client.open_sftp()
            except (OSError, self._paramiko.SSHException, EOFError) as exc:
                raise self._lost(exc, "opening SFTP") from None
        return self._sftp

    def run(self, argv: Sequence[str], on_line: OnLine | None = None, timeout: float | None = None) -> tuple[int, str]:
        try:
            tr = self.client.get_transport()
            if tr is None or not tr.is_active():
                raise EOFError("transport closed")
            chan = tr.open_session(timeout=15)
            chan.set_combine_stderr(True)
            if timeout:
                chan.settimeout(timeout)
            chan.exec_command(quote(argv))
            out, buf = [], b""
            while True:
                data = chan.recv(32768)
                if not data:
                    break
                buf += data
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    text = ln.decode("utf-8", "replace")
                    out.append(text + "\n")
                    if on_line:
                        on_line(text)
            if buf:
                text = buf.decode("utf-8", "replace")
                out.append(text)
                if on_line:
                    on_line(text)
            rc = chan.recv_exit_status()
            chan.close()
        except (TimeoutError, OSError, self._paramiko.SSHException, EOFError) as exc:
            raise self._lost(exc, f"`{quote(argv)[:80]}`") from None
        return rc, "".join(out)

    def home(self) -> str:
        if self._home is None:
            try:
                self._home = self.sftp.normalize(".")
            except (OSError, self._paramiko.SSHException, EOFError) as exc:
                raise self._lost(exc, "reading the home folder") from None
        return self._home

    def put(self, local: str, remote: str, progress: Progress | None = None) -> None:
        cb = (lambda done, _total: progress(done)) if progress else None
        try:
            self.sftp.put(local, remote, callback=cb, confirm=True)
            self.sftp.chmod(remote, os.stat(local).st_mode & 0o755)  # keep scripts executable
        except (TimeoutError, OSError, self._paramiko.SSHException, EOFError) as exc:
            raise self._lost(exc, f"upload of {Path(local).name}") from None

    def get(self, remote: str) -> bytes:
        try:
            with self.sftp.open(remote, "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise TransportError(f"{remote} does not exist on {self.describe()}") from None
        except (TimeoutError, OSError, self._paramiko.SSHException, EOFError) as exc:
            raise self._lost(exc, f"download of {remote}") from None

    def rename(self, src: str, dst: str) -> None:
        try:
            self.sftp.posix_rename(src, dst)
        except (TimeoutError, OSError, self._paramiko.SSHException, EOFError) as exc:
            raise self._lost(exc, f"rename of {src}") from None

    # SFTP for file-system operations: each exec costs a session (~0.3 s on a small board); SFTP is one round trip
    def _sftp_call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except (TimeoutError, self._paramiko.SSHException, EOFError) as exc:
            raise self._lost(exc, what) from None

    def exists(self, path: str) -> bool:
        try:
            self._sftp_call(f"stat {path}", self.sftp.lstat, path)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._lost(exc, f"stat {path}") from None

    def makedirs(self, path: str) -> None:
        parts, cur = [p for p in path.split("/") if p], ""
        for part in parts:
            cur += "/" + part
            if not self.exists(cur):
                try:
                    self._sftp_call(f"mkdir {cur}", self.sftp.mkdir, cur)
                except OSError as exc:
                    if not self.exists(cur):
                        raise TransportError(f"cannot create {cur} on {self.describe()}: {exc}") from None

    def remove(self, path: str) -> None:
        try:
            self._sftp_call(f"remove {path}", self.sftp.remove, path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise TransportError(f"cannot remove {path} on {self.describe()}: {exc}") from None

    def drop(self) -> None:
        """Cut the connection without a goodbye (used by fault tests)."""
        tr = self.client.get_transport()
        if tr is not None:
            tr.sock.close()
            tr.close()

    def close(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:  # noqa: BLE001 - closing a dead session
                pass
        self.client.close()


class _Refuse:
    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname: str, key) -> None:
        raise HostKeyError(
            f"{hostname} is not in {self.known_hosts} (its {key.get_name()} key is {fingerprint(key)}); check that "
            "fingerprint on the board (`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub`), then run again with "
            "--accept-new-host-key to record it"
        )


class _AcceptNew(_Refuse):
    def missing_host_key(self, client, hostname: str, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with open(self.known_hosts, "a") as f:  # append: keep the user's other entries and comments untouched
            f.write(line)
