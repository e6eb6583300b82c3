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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.bundle import MANIFEST, Unpacked, opened
from edgekit.errors import EdgekitError
from edgekit.fsutil import sha256_file
from edgekit.transports.base import Transport

STAGING = ".staging"


class FlashError(EdgekitError):
    """A bundle arrived on the board different from what was sent."""


def default_dest(man: dict[str, Any]) -> str:
    return f"~/edgekit/{man['name']}"


@dataclass
class FlashResult:
    dest: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already on the board with the right hash
    bytes_sent: int = 0
    already_installed: bool = False
    seconds: float = 0.0
    manifest: dict[str, Any] = field(default_factory=dict)


# on_file(rel, size) -> per-file progress callback (bytes done)
FileProgress = Callable[[str, int], Callable[[int], None] | None]


def flash(bundle: str | Path | Unpacked, transport: Transport, dest: str | None = None,
          on_file: FileProgress | None = None, log: Callable[[str], None] = lambda m: None) -> FlashResult:
    t0 = time.perf_counter()
    with opened(bundle) as ub:
        man = ub.manifest
        dest = transport.resolve(dest or default_dest(man))
        staging = dest + STAGING
        wanted = {rel: info["sha256"] for rel, info in man["files"].items()}
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
            log(f"resuming: {staging} exists from an earlier run")
            for rel in sorted(set(transport.list_files(staging)) - set(order)):  # left by another bundle
                transport.remove(posixpath.join(staging, rel))
        transport.makedirs(staging)
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
        if transport.exists(dest):
            old = f"{dest}.old-{int(time.time())}"
            transport.rename(dest, old)
        transport.rename(staging, dest)
        if old:
            transport.remove_tree(old)
        res.seconds = time.perf_counter() - t0
        return res
