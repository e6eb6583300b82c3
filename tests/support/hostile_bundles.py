"""Hostile bundles: the good digits bundle with its manifest edited, members added (a gzip bomb, links out, a
symlink chain, paths that climb out), or its archive damaged."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path


def bundle_members(bundle: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(bundle) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def write_tar(dest: Path, items: list[tuple[tarfile.TarInfo, bytes | io.RawIOBase | None]]) -> Path:
    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        for info, data in items:
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info, data)
    return dest


def bundle_with(dest: Path, good: Path, edit: Callable[[dict], None] | None = None,
                raw_manifest: bytes | None = None, extra: list | None = None, first: list | None = None) -> Path:
    items = []
    for info, data in bundle_members(good):
        if info.name == "manifest.json":
            if raw_manifest is not None:
                data = raw_manifest
            elif edit is not None:
                man = json.loads(data)
                edit(man)
                data = json.dumps(man).encode()
        items.append((info, data))
    return write_tar(dest, (first or []) + items + (extra or []))


class Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        k = self.left if size < 0 else min(size, self.left)
        self.left -= k
        return b"\0" * k


def zeros_sha256(n: int) -> str:
    import hashlib

    h, block = hashlib.sha256(), b"\0" * (1 << 24)
    while n > 0:
        h.update(block[: min(n, len(block))])
        n -= len(block)
    return h.hexdigest()


def bomb_bundle(dest: Path, good: Path, nbytes: int) -> Path:
    """A bundle with one member of ``nbytes`` zeros, listed in the manifest with its right sha256."""
    def edit(man: dict) -> None:
        man["files"]["pad.bin"] = {"sha256": zeros_sha256(nbytes), "bytes": nbytes}

    info = tarfile.TarInfo("pad.bin")
    info.size = nbytes
    return bundle_with(dest, good, edit, extra=[(info, Zeros(nbytes))])


def link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def symlink_chain_bundle(dest: Path, good: Path, secret: Path) -> Path:
    """``s -> .``, ``x1 -> s/..``, ... ``x10 -> x9/..`` (deepest first) and a manifest file ``x10/<secret>``
    with the secret's right sha256: a flash that follows the chain copies a host file to the board."""
    import hashlib

    rel = "x10/" + str(secret).lstrip("/")
    chain = [link("x10", "x9/..")] + [link(f"x{i}", f"x{i - 1}/..") for i in range(9, 1, -1)]
    chain += [link("x1", "s/.."), link("s", ".")]

    def edit(man: dict) -> None:
        data = secret.read_bytes()
        man["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    return bundle_with(dest, good, edit, first=chain)
