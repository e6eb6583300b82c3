"""Bundle files: a verified build folder packed as one ``.tar.gz``, and its safe unpacking.

Packing refuses a build whose manifest says host verification failed, and a build whose
files no longer match the manifest's sha256. The archive holds ``manifest.json`` and
exactly the files the manifest lists, with fixed owners and times (same build, same
bytes).

Unpacking checks every member before anything is written: no absolute path, no ``..``,
no link leaving the bundle, no device or fifo, no file the manifest does not list; after
extraction every file's sha256 is checked against the manifest. A bundle that fails any
check raises :class:`BundleError` and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError
from edgekit.fsutil import sha256_file

MANIFEST = "manifest.json"


class BundleError(EdgekitError):
    """A build or bundle that cannot be packed, unpacked or trusted."""


def read_manifest(build_dir: Path) -> dict[str, Any]:
    path = Path(build_dir) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{build_dir} is not an edgekit build (no {MANIFEST}); give the folder `edgekit convert -o` wrote")
    try:
        man = json.loads(path.read_text())
    except ValueError as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); convert the model again") from None
    if not isinstance(man.get("files"), dict) or not man["files"]:
        raise BundleError(f"{path} lists no files; convert the model again")
    return man


def check_files(root: Path, man: dict[str, Any]) -> None:
    """Every file the manifest lists is present under ``root`` with its sha256."""
    bad = []
    for rel, info in sorted(man["files"].items()):
        _check_name(rel)
        p = root / rel
        if not p.is_file() or p.is_symlink():
            bad.append(f"{rel}: missing")
        elif sha256_file(p) != info["sha256"]:
            bad.append(f"{rel}: sha256 differs from the manifest")
    if bad:
        raise BundleError(f"{root}: {'; '.join(bad)}; the build was changed after conversion: convert it again")


def _check_name(name: str) -> str:
    """A member name that stays inside the bundle, normalised; else BundleError."""
    if not name or name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"bundle member {name!r} has an absolute path; refusing the bundle")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise BundleError(f"bundle member {name!r} climbs out with '..'; refusing the bundle")
    norm = posixpath.normpath(name)
    return "" if norm == "." else norm


def make_bundle(build_dir: str | Path, out: str | Path) -> tuple[Path, dict[str, Any]]:
    """Pack a verified build folder into ``out`` (.tar.gz), written atomically."""
    build_dir = Path(build_dir)
    man = read_manifest(build_dir)
    ver = man.get("verification") or {}
    if ver.get("passed") is not True:
        why = "; ".join(ver.get("failures") or []) or "no passing host verification recorded"
        raise BundleError(f"{build_dir}: host verification failed ({why}); fix the conversion before bundling")
    check_files(build_dir, man)
    out = Path(out)
    if out.exists() and out.is_dir():
        raise BundleError(f"{out} is a folder; give a file name such as {man['name']}.tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    try:
        with open(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            for rel in [MANIFEST, *sorted(man["files"])]:
                data = (build_dir / rel).read_bytes()
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), 0o755 if rel.endswith((".sh", ".py")) else 0o644, 0
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(data))
        Path(tmp).replace(out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.resolve(), man


def _inside(name: str, link: str) -> bool:
    target = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
    return not (link.startswith("/") or target == ".." or target.startswith("../"))


def check_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Validate every member of an open archive; nothing is extracted here."""
    members = tar.getmembers()
    for m in members:
        name = _check_name(m.name)
        if m.issym() or m.islnk():
            if m.islnk():
                _check_name(m.linkname)
            elif not _inside(name, m.linkname):
                raise BundleError(f"bundle member {m.name!r} links to {m.linkname!r}, outside the bundle; refusing the bundle")
        elif not (m.isfile() or m.isdir()):
            raise BundleError(f"bundle member {m.name!r} is a device or fifo; refusing the bundle")
    return members


@dataclass
class Unpacked:
    root: Path
    manifest: dict[str, Any]
    _tmp: tempfile.TemporaryDirectory | None = None

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> Unpacked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def unpack(bundle: str | Path, dest: Path | None = None) -> Unpacked:
    """Open a bundle (``.tar.gz`` file or build folder) and check it; returns its folder.

    A folder is checked in place. An archive is validated member by member first, then
    extracted into ``dest`` (or a temporary folder removed by ``Unpacked.cleanup``), and
    every file's sha256 is checked against its manifest.
    """
    bundle = Path(bundle)
    if bundle.is_dir():
        man = read_manifest(bundle)
        check_files(bundle, man)
        return Unpacked(bundle.resolve(), man)
    if not bundle.is_file():
        raise BundleError(f"bundle {bundle} does not exist; make one with `edgekit bundle BUILD_DIR -o NAME.tar.gz`")
    try:
        tar = tarfile.open(bundle, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise BundleError(f"{bundle} is not a readable tar archive ({exc}); make it again with `edgekit bundle`") from None
    with tar:
        members = check_members(tar)
        names = {_check_name(m.name) for m in members if m.isfile()}
        if MANIFEST not in names:
            raise BundleError(f"{bundle} holds no {MANIFEST}; it is not an edgekit bundle")
        man = json.loads(tar.extractfile(MANIFEST).read())  # type: ignore[union-attr]
        for rel in man.get("files", {}):
            _check_name(rel)
        extra = sorted(names - set(man.get("files", {})) - {MANIFEST})
        if extra:
            raise BundleError(f"{bundle} holds files its manifest does not list ({', '.join(extra[:5])}); refusing the bundle")
        holder = None
        if dest is None:
            holder = tempfile.TemporaryDirectory(prefix="edgekit-bundle-")
            dest = Path(holder.name)
        dest.mkdir(parents=True, exist_ok=True)
        try:
            tar.extractall(dest, members=members, filter="data")
            check_files(dest, man)
        except BaseException:
            if holder is not None:
                holder.cleanup()
            else:
                shutil.rmtree(dest, ignore_errors=True)
            raise
    return Unpacked(dest.resolve(), man, holder)


@contextlib.contextmanager
def opened(bundle: str | Path | Unpacked) -> Iterator[Unpacked]:
    """``bundle`` unpacked and checked: an :class:`Unpacked` is used as it is (its owner cleans it up),
    a path is unpacked here and cleaned up on exit. Lets a caller that already read the manifest
    hand the same unpacked bundle on, instead of unpacking and hashing it twice."""
    if isinstance(bundle, Unpacked):
        yield bundle
        return
    with unpack(bundle) as ub:
        yield ub
