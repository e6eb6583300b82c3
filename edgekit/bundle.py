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
import gzip
import io
import json
import os
import lzma
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgekit.errors import EdgekitError
from edgekit.manifest import MANIFEST, SCHEMA_VERSION, Manifest, validation_message
from edgekit.quiet import first_line
from edgekit.fsutil import file_mode, sha256_file, size_limit, work_dir



class BundleError(EdgekitError):
    """A build or bundle that cannot be packed, unpacked or trusted."""


MAX_MANIFEST_BYTES = 16 << 20  # an edgekit manifest is a few hundred kB at most
MAX_BUNDLE_MB_ENV = "EDGEKIT_MAX_BUNDLE_MB"
DEFAULT_MAX_BUNDLE_MB = 1024.0


def max_bundle_bytes(max_mb: float | None = None) -> int:
    """The cap on a bundle's unpacked size: ``max_mb``, else ``$EDGEKIT_MAX_BUNDLE_MB``, else 1 GiB."""
    return size_limit(max_mb, MAX_BUNDLE_MB_ENV, DEFAULT_MAX_BUNDLE_MB, "--max-bundle-mb", BundleError, 1 << 20)


def parse_manifest(raw: bytes, where: str) -> Manifest:
    """A manifest's bytes -> the checked manifest dict (:func:`validate_manifest`)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{where}: {MANIFEST} is {len(raw) / 2**20:.1f} MiB, over the {MAX_MANIFEST_BYTES >> 20} MiB an "
                          "edgekit manifest can be; refusing it")
    try:
        man = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BundleError(f"{where}: {MANIFEST} is not valid JSON ({str(exc)[:120]}); convert the model again") from None
    return validate_manifest(man, where)


def validate_manifest(man: Any, where: str) -> Manifest:
    """The manifest as the typed record (:class:`edgekit.manifest.Manifest`): every path stays inside the
    bundle (files, runner entry), the name is one plain folder name, hashes are sha256. Names the bad field."""
    if not isinstance(man, dict):
        raise BundleError(f"{where}: {MANIFEST} holds a JSON {type(man).__name__}, not an edgekit manifest (an object); "
                          "make the build again with `edgekit convert`")
    if man.get("schema_version") != SCHEMA_VERSION:
        old = " (an older edgekit wrote it)" if man.get("schema") == 1 else ""
        raise BundleError(f"{where}: manifest field 'schema_version' is {man.get('schema_version')!r}{old}; this edgekit "
                          f"reads {SCHEMA_VERSION}: make the build again with `edgekit convert`")
    try:
        return Manifest.model_validate(man)
    except ValidationError as exc:
        raise BundleError(f"{where}: {validation_message(exc)}; make the build again with `edgekit convert`") from None


def read_manifest(build_dir: Path) -> Manifest:
    path = Path(build_dir) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{build_dir} is not an edgekit build (no {MANIFEST}); give the folder `edgekit convert -o` wrote")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{path} is {path.stat().st_size / 2**20:.1f} MiB, over the {MAX_MANIFEST_BYTES >> 20} MiB an "
                          "edgekit manifest can be; refusing it")
    return parse_manifest(path.read_bytes(), str(build_dir))


def _inside_root(root: Path, rel: str) -> bool:
    """``root/rel`` with every link resolved (chains included) still lies inside ``root``."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))
    return real == real_root or real.startswith(real_root + os.sep)


def check_files(root: Path, man: Manifest) -> None:
    """Every file the manifest lists is present under ``root`` with its sha256."""
    bad = []
    for rel, info in sorted(man.files.items()):
        _check_name(rel)
        if not _inside_root(root, rel):
            raise BundleError(f"{root}: manifest file {rel!r} resolves through a link to a place outside the bundle; "
                              "refusing the bundle")
        p = root / rel
        if not p.is_file() or p.is_symlink():
            bad.append(f"{rel}: missing")
        elif sha256_file(p) != info.sha256:
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


def make_bundle(build_dir: str | Path, out: str | Path) -> tuple[Path, Manifest]:
    """Pack a verified build folder into ``out`` (.tar.gz), written atomically."""
    build_dir = Path(build_dir)
    man = read_manifest(build_dir)
    if not man.verification_passed:
        why = "; ".join(man.verification.get("failures") or []) or "no passing host verification recorded"
        raise BundleError(f"{build_dir}: host verification failed ({why}); fix the conversion before bundling")
    check_files(build_dir, man)
    out = Path(out)
    if out.exists() and out.is_dir():
        raise BundleError(f"{out} is a folder; give a file name such as {man.name}.tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    try:
        # the gzip header's time is 0 too (tarfile's "w:gz" writes the current time there): the same build gives
        # the same bytes whenever it is packed
        with open(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel in [MANIFEST, *sorted(man.files)]:
                data = (build_dir / rel).read_bytes()
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), 0o755 if rel.endswith((".sh", ".py")) else 0o644, 0
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(data))
        os.chmod(tmp, file_mode())  # mkstemp's 0600 -> what a new file gets under the user's umask
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
    manifest: Manifest
    _tmp: Any = None  # the work_dir context that owns root, when unpack made it

    def cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.__exit__(None, None, None)
            self._tmp = None

    def __enter__(self) -> Unpacked:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def unpack(bundle: str | Path, dest: Path | None = None, max_mb: float | None = None) -> Unpacked:
    """Open a bundle (``.tar.gz`` file or build folder) and check it; returns its folder.

    A folder is checked in place. An archive is validated member by member first (names, links, types,
    each file's size against the manifest's, the total against ``max_mb`` and the free disk space), then
    extracted into ``dest`` (or a temporary folder removed by ``Unpacked.cleanup``), every link is resolved
    to check it stays inside, and every file's sha256 is checked against its manifest.
    """
    bundle = Path(bundle)
    if bundle.is_dir():
        man = read_manifest(bundle)
        check_files(bundle, man)
        return Unpacked(bundle.resolve(), man)
    if not bundle.is_file():
        raise BundleError(f"bundle {bundle} does not exist; make one with `edgekit bundle BUILD_DIR -o NAME.tar.gz`")
    cap = max_bundle_bytes(max_mb)
    damaged = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)
    try:
        tar = tarfile.open(bundle, "r:*")
    except damaged as exc:
        raise BundleError(f"{bundle} is not a readable tar archive ({first_line(exc, 160)}); make it again with `edgekit bundle`") from None
    holder = None
    made_dest = False  # edgekit never deletes a folder it did not make
    try:
        with tar:
            try:
                members = check_members(tar)
            except damaged as exc:
                raise BundleError(f"{bundle} is truncated or damaged ({first_line(exc, 160)}); copy it again or make it again "
                                  "with `edgekit bundle`") from None
            files = {_check_name(m.name): m for m in members if m.isfile()}
            if MANIFEST not in files:
                raise BundleError(f"{bundle} holds no {MANIFEST}; it is not an edgekit bundle")
            if files[MANIFEST].size > MAX_MANIFEST_BYTES:
                raise BundleError(f"{bundle}: {MANIFEST} is {files[MANIFEST].size / 2**20:.1f} MiB, over the "
                                  f"{MAX_MANIFEST_BYTES >> 20} MiB an edgekit manifest can be; refusing the bundle")
            try:
                raw = tar.extractfile(files[MANIFEST]).read()  # type: ignore[union-attr]
            except damaged as exc:
                raise BundleError(f"{bundle} is truncated or damaged ({first_line(exc, 160)}); copy it again") from None
            man = parse_manifest(raw, str(bundle))
            extra = sorted(set(files) - set(man.files) - {MANIFEST})
            if extra:
                raise BundleError(f"{bundle} holds files its manifest does not list ({', '.join(extra[:5])}); refusing the bundle")
            for rel, info in man.files.items():
                if rel in files and files[rel].size != info.bytes:
                    raise BundleError(f"{bundle}: member {rel} is {files[rel].size:,} bytes, the manifest says "
                                      f"{info.bytes:,}; refusing the bundle")
            total = sum(m.size for m in files.values())
            if total > cap:
                raise BundleError(f"{bundle} unpacks to {total / 2**20:,.0f} MiB, over the {cap / 2**20:,.0f} MiB limit; "
                                  f"if you expect a bundle this large, raise it with --max-bundle-mb (or ${MAX_BUNDLE_MB_ENV})")
            if dest is None:
                holder = work_dir("edgekit-bundle-")
                dest = holder.__enter__()
            made_dest = not dest.exists()
            dest.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(dest).free
            if total > free:
                raise BundleError(f"{bundle} unpacks to {total / 2**20:,.0f} MiB, but {dest} has only "
                                  f"{free / 2**20:,.0f} MiB free; free some space (or set TMPDIR)")
            try:
                tar.extractall(dest, members=members, filter="data")
            except damaged as exc:
                raise BundleError(f"{bundle} is truncated or damaged ({first_line(exc, 160)}); copy it again or make it again "
                                  "with `edgekit bundle`") from None
            except tarfile.FilterError as exc:  # pragma: no cover - check_members refuses these first
                raise BundleError(f"{bundle}: {exc}; refusing the bundle") from None
            for m in members:  # links resolved as a whole (a chain of links, each harmless alone)
                if not _inside_root(dest, _check_name(m.name)):
                    raise BundleError(f"bundle member {m.name!r} resolves through links to a place outside the bundle; "
                                      "refusing the bundle")
            check_files(dest, man)
    except BaseException:
        if holder is not None:
            holder.__exit__(None, None, None)
        elif made_dest and dest is not None:
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
