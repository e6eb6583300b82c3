"""Files: hashing, atomic outputs (temporary sibling, then rename), and edgekit's data folder."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from edgekit.errors import OutputError

MARKER = "manifest.json"
DATA_DIR_ENV = "EDGEKIT_DATA_DIR"


def data_root() -> Path:
    """edgekit's data folder (results store, calibration fits): ``$EDGEKIT_DATA_DIR``, else
    platformdirs' user data dir (``~/.local/share/edgekit`` on Linux). The one place that finds it."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("edgekit", appauthor=False))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_tree(path: Path) -> str:
    """Hash of a file, or of a folder's files (relative names and contents)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(p.relative_to(path).as_posix().encode() + b"\0" + sha256_file(p).encode())
    return h.hexdigest()


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``dest``; on success it replaces ``dest``.

    A failed or killed run leaves ``dest`` as it was (the sibling is removed on
    failure; a killed run leaves only a ``.<name>.tmp-*`` folder, never a half-written
    ``dest``). An existing ``dest`` is replaced only if it is an earlier edgekit output
    (it holds a manifest.json) or empty; anything else is refused.
    """
    dest = Path(dest).resolve()
    if dest.exists():
        if not dest.is_dir():
            raise OutputError(f"{dest} exists and is a file; choose another output folder with -o")
        if any(dest.iterdir()) and not (dest / MARKER).exists():
            raise OutputError(
                f"{dest} exists and is not an edgekit output (no {MARKER}); "
                "choose another folder with -o or remove it"
            )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes 0700; the output is an ordinary folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_bytes(dest: Path, data: bytes) -> None:
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
