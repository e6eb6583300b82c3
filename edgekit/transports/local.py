"""The local transport: the host board is this machine (no network, no shell)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from edgekit.fsutil import sha256_file
from edgekit.transports.base import OnLine, Progress, Transport, TransportError


class LocalTransport(Transport):
    name = "local"

    def describe(self) -> str:
        return "this machine (local)"

    def run(self, argv: Sequence[str], on_line: OnLine | None = None, timeout: float | None = None) -> tuple[int, str]:
        try:
            proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace", cwd=self.home())
        except OSError as exc:
            raise TransportError(f"cannot run {argv[0]!r} here: {exc}") from None
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if on_line:
                on_line(line.rstrip("\n"))
        rc = proc.wait(timeout)
        return rc, "".join(lines)

    def home(self) -> str:
        return str(Path.home())

    def put(self, local: str, remote: str, progress: Progress | None = None) -> None:
        done = 0
        with open(local, "rb") as src, open(remote, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
                done += len(block)
                if progress:
                    progress(done)
        shutil.copymode(local, remote)  # keep scripts executable

    def get(self, remote: str) -> bytes:
        try:
            return Path(remote).read_bytes()
        except OSError as exc:
            raise TransportError(f"cannot read {remote}: {exc}") from None

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def remove(self, path: str) -> None:
        Path(path).unlink(missing_ok=True)

    def copy_file(self, src: str, dst: str) -> None:
        shutil.copy2(src, dst)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path) and not os.path.islink(path)

    def list_entries(self, root: str) -> list[str]:
        base = Path(root)
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_symlink() or not p.is_dir())

    def list_files(self, root: str) -> list[str]:
        base = Path(root)
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() and not p.is_symlink())

    def sha256(self, paths: Sequence[str]) -> dict[str, str | None]:
        return {p: sha256_file(Path(p)) if os.path.isfile(p) else None for p in paths}
