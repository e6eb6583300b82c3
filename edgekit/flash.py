"""Flash a bundle onto a board: stage, verify on the board, then rename into place.

    <dest>.staging/   files are uploaded here (resumable)
    <dest>/           the installed bundle: appears only once every file is verified

1. The bundle is unpacked and checked locally (paths, links, sha256: edgekit.bundle).
2. If ``<dest>`` already holds this bundle with every hash right, nothing is sent.
3. Otherwise the staging folder is reused (a resumed run) or seeded from an older
   install; every file there is hashed ON the board and only files whose hash is wrong
   or missing are uploaded (manifest.json last).
4. Every staged file is hashed on the board again; a mismatch removes that file from
   staging and fails (a rerun uploads it again).
5. ``<dest>`` is moved aside, staging renamed to ``<dest>``, the old copy removed.

A dropped connection at any point leaves ``<dest>`` as it was; the next run resumes.
"""

from __future__ import annotations

import posixpath
import time
from fnmatch import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.bundle import MANIFEST, Unpacked, opened
from edgekit.manifest import Manifest
from edgekit.errors import EdgekitError
from edgekit.fsutil import sha256_file
from edgekit.transports.base import Transport

STAGING = ".staging"
STAGING_MARK = ".edgekit-staging"  # written first into every staging folder edgekit makes
DEFAULT_ROOT = "~/edgekit"
# files the bundle's own runner writes on the board (smoke result, TensorRT engine, Python byte code)
BOARD_WRITTEN = ("smoke_result.json", "smoke_result.json.tmp", "model.engine", "model.engine.tmp", "timing.cache",
                 "timing.cache.tmp", "__pycache__/*", "*/__pycache__/*")


class FlashError(EdgekitError):
    """A bundle arrived on the board different from what was sent."""


def default_dest(man: Manifest) -> str:
    return f"{DEFAULT_ROOT}/{man.name}"


def foreign_on_board(transport: Transport, dest: str) -> list[str] | None:
    """What in the board folder ``dest`` edgekit did not put there: None when it is absent, empty, or an edgekit
    install (its manifest lists every file; only the runner's own outputs besides); else the foreign entries."""
    if not transport.exists(dest):
        return None
    if not transport.is_dir(dest):
        return ["(not a folder)"]
    entries = transport.list_entries(dest)
    if not entries:
        return None
    listed: set[str] = set()
    if MANIFEST in entries:
        try:
            from edgekit.bundle import parse_manifest

            listed = set(parse_manifest(transport.get(posixpath.join(dest, MANIFEST)), dest).files) | {MANIFEST}
        except EdgekitError:
            listed = set()
    regular = set(transport.list_files(dest))
    foreign = [e for e in entries if not ((e in listed and e in regular)
                                          or (listed and e in regular and any(fnmatch(e, p) for p in BOARD_WRITTEN)))]
    return foreign or None


def _refuse_foreign(transport: Transport, path: str, what: str) -> None:
    foreign = foreign_on_board(transport, path)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise FlashError(f"{path} on {transport.describe()} holds files edgekit did not write ({shown}); edgekit "
                         f"replaces only its own installs: {what}")


@dataclass
class FlashResult:
    dest: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already on the board with the right hash
    bytes_sent: int = 0
    already_installed: bool = False
    seconds: float = 0.0
    manifest: Manifest | None = None

    def record_fields(self) -> dict[str, object]:
        """What the results store keeps of a flash (besides the build's own fields and the host)."""
        return {"dest": self.dest, "uploaded": self.uploaded, "skipped": self.skipped, "bytes_sent": self.bytes_sent,
                "seconds": round(self.seconds, 3), "passed": True}


def _mark(transport: Transport, staging: str) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".mark", delete=False) as f:
        f.write("edgekit staging folder\n")
    try:
        transport.put(f.name, posixpath.join(staging, STAGING_MARK))
    finally:
        Path(f.name).unlink(missing_ok=True)


# on_file(rel, size) -> per-file progress callback (bytes done)
FileProgress = Callable[[str, int], Callable[[int], None] | None]


def flash(bundle: str | Path | Unpacked, transport: Transport, dest: str | None = None,
          on_file: FileProgress | None = None, log: Callable[[str], None] = lambda m: None) -> FlashResult:
    t0 = time.perf_counter()
    with opened(bundle) as ub:
        man = ub.manifest
        if dest is None:
            root = transport.resolve(DEFAULT_ROOT)
            dest = transport.resolve(default_dest(man))
            if posixpath.dirname(dest) != root:  # the manifest's name is checked too; this is the last word
                raise FlashError(f"the bundle name {man.name!r} leads outside {root}; refusing the bundle")
        else:
            dest = transport.resolve(dest)
            if dest in ("/", transport.resolve("~")):
                raise FlashError(f"--dest {dest} is a whole folder tree, not a bundle folder; give e.g. "
                                 f"{default_dest(man)}")
        _refuse_foreign(transport, dest, "give another --dest (default ~/edgekit/<bundle name>)")
        staging = dest + STAGING
        wanted = {rel: info.sha256 for rel, info in man.files.items()}
        wanted[MANIFEST] = sha256_file(ub.root / MANIFEST)
        order = sorted(r for r in wanted if r != MANIFEST) + [MANIFEST]  # manifest last
        res = FlashResult(dest=dest, manifest=man)

        def remote_hashes(base: str) -> dict[str, str | None]:
            got = transport.sha256([posixpath.join(base, r) for r in order])
            return {r: got[posixpath.join(base, r)] for r in order}

        installed: dict[str, str | None] = {}
        if transport.exists(posixpath.join(dest, MANIFEST)):
            installed = remote_hashes(dest)
            if installed == wanted:
                res.already_installed, res.skipped = True, list(order)
                res.seconds = time.perf_counter() - t0
                log(f"{dest} already holds this bundle, every sha256 verified on the board")
                return res
            bad = [r for r in order if installed[r] != wanted[r]]
            log(f"{dest} differs from the bundle in {len(bad)} file(s): {', '.join(bad[:5])}; reinstalling")
        resuming = transport.exists(staging)
        if resuming:
            if not (transport.is_dir(staging) and transport.exists(posixpath.join(staging, STAGING_MARK))):
                raise FlashError(f"{staging} on {transport.describe()} exists and edgekit did not make it; move it "
                                 "away or give another --dest")
            log(f"resuming: {staging} exists from an earlier run")
            for rel in sorted(set(transport.list_entries(staging)) - set(order) - {STAGING_MARK}):  # another bundle's
                transport.remove(posixpath.join(staging, rel))
        transport.makedirs(staging)
        if not resuming:
            _mark(transport, staging)
        for d in sorted({posixpath.dirname(r) for r in order} - {""}):
            transport.makedirs(posixpath.join(staging, d))
        have = remote_hashes(staging) if resuming else dict.fromkeys(order)
        for rel in order:  # files an older install already holds, right hash: copy on the board, do not resend
            if have[rel] != wanted[rel] and installed.get(rel) == wanted[rel]:
                transport.copy_file(posixpath.join(dest, rel), posixpath.join(staging, rel))
                have[rel] = transport.sha256([posixpath.join(staging, rel)])[posixpath.join(staging, rel)]
        for rel in order:
            if have[rel] == wanted[rel]:
                res.skipped.append(rel)
                continue
            src = ub.root / rel
            size = src.stat().st_size
            cb = on_file(rel, size) if on_file else None
            transport.put(str(src), posixpath.join(staging, rel), cb)
            res.uploaded.append(rel)
            res.bytes_sent += size
        log(f"uploaded {len(res.uploaded)} file(s) ({res.bytes_sent:,} bytes), {len(res.skipped)} already staged")
        have = remote_hashes(staging)
        bad = [r for r in order if have[r] != wanted[r]]
        if bad:
            for r in bad:
                transport.remove(posixpath.join(staging, r))
            raise FlashError(
                f"after upload the sha256 on {transport.describe()} differs for {', '.join(bad)} "
                "(corrupted in transfer or on the board's storage); those files were removed from staging: "
                "run flash again to resend them, and check the board's storage if it repeats"
            )
        log(f"all {len(order)} files verified by sha256 on the board")
        old = None
        transport.remove(posixpath.join(staging, STAGING_MARK))
        if transport.exists(dest):
            _refuse_foreign(transport, dest, "give another --dest")  # again: it may have changed while uploading
            old = f"{dest}.old-{int(time.time())}"
            transport.rename(dest, old)
        transport.rename(staging, dest)
        if old:
            transport.remove_tree(old)
        res.seconds = time.perf_counter() - t0
        return res
