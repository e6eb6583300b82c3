"""Files: hashing, atomic outputs (temporary sibling, then rename), and edgekit's data folder."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from edgekit.errors import OutputError

MARKER = "manifest.json"
DATA_DIR_ENV = "EDGEKIT_DATA_DIR"


def data_dir(kind: str) -> Path:
    """Folder of shipped profiles / firmware: ``boards``, ``targets`` or ``firmware`` (package data, also in
    editable installs)."""
    from importlib import resources

    return Path(str(resources.files(f"edgekit.{kind}")))


def data_root() -> Path:
    """edgekit's data folder (results store, calibration fits): ``$EDGEKIT_DATA_DIR``, else
    platformdirs' user data dir (``~/.local/share/edgekit`` on Linux). The one place that finds it."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("edgekit", appauthor=False))


def size_limit(max_mb: float | None, env: str, default_mb: float, flag: str, error: type[Exception],
               unit: int = 1_000_000) -> int:
    """A size cap in bytes: ``max_mb`` (a CLI flag), else ``$env``, else ``default_mb``; ``unit`` is the MB."""
    import math

    if max_mb is None:
        raw = os.environ.get(env)
        try:
            max_mb = float(raw) if raw else default_mb
        except ValueError:
            raise error(f"${env}={raw!r}: expected a number of MB") from None
    if not math.isfinite(max_mb) or max_mb <= 0:
        raise error(f"{flag} {max_mb}: expected a positive number of MB")
    return int(max_mb * unit)


def same_file(a: str | Path, b: str | Path) -> bool:
    """The two paths name one file (False when either is missing)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


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


# ---------------------------------------------------------------- work folders with a pid lock

LOCK_SUFFIX = ".lock"
_LOCK_TAG = "edgekit "
notice: Callable[[str], None] = lambda msg: None  # the CLI points this at its console (stale folders removed)
stop_signal: int | None = None  # set by the CLI's SIGINT/SIGTERM handler: no output is renamed into place after it
# what this process did with its outputs, for the CLI's one line when a run is stopped: the destinations renamed
# into place, and those whose partial sibling was removed instead (dest left as it was)
written: list[Path] = []
abandoned: list[Path] = []
scratch_removed: list[Path] = []  # work folders removed (each is removed however its run ends)


def check_stop() -> None:
    """Raise again for a signal whose exception a toolchain swallowed: a stopped run never finishes an output."""
    if stop_signal is not None:
        import signal

        if stop_signal == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + stop_signal)


def _hold_lock(lock: Path) -> int:
    """Create ``lock`` (exclusively) and hold an flock on it for the life of this process; the kernel drops it
    when the process dies, however it dies, which is how a later run knows the folder beside it is stale."""
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no flock (Windows): folders are still removed on exit, not swept after a kill
        pass
    os.write(fd, f"{_LOCK_TAG}{os.getpid()}\n".encode())
    return fd


def _release(fd: int, lock: Path) -> None:
    with contextlib.suppress(OSError):
        lock.unlink()
    with contextlib.suppress(OSError):
        os.close(fd)


def sweep_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove ``parent/<prefix>*`` folders whose lock file edgekit wrote and whose owner process is dead.

    Only folders with an edgekit lock beside them are touched (a folder is never removed because of its name
    alone); a live run holds its lock, so it is never swept. Returns the folders removed."""
    try:
        import fcntl
    except ImportError:
        return []
    removed = []
    try:
        locks = [p for p in Path(parent).iterdir() if p.name.startswith(prefix) and p.name.endswith(LOCK_SUFFIX)]
    except OSError:
        return []
    for lock in locks:
        try:
            fd = os.open(lock, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its edgekit run is alive
            if not os.read(fd, 64).decode(errors="replace").startswith(_LOCK_TAG):
                continue  # not ours, or being created right now
            folder = lock.with_name(lock.name[: -len(LOCK_SUFFIX)])
            for victim in (folder, folder.with_name(folder.name + ".old")):
                if victim.is_dir() and not victim.is_symlink():
                    shutil.rmtree(victim, ignore_errors=True)
                    removed.append(victim)
            with contextlib.suppress(OSError):
                lock.unlink()
        finally:
            os.close(fd)
    if removed:
        notice(f"removed {len(removed)} folder(s) left by an edgekit run that was killed: "
               + ", ".join(str(p) for p in removed[:5]))
    return removed


@contextlib.contextmanager
def work_dir(prefix: str = "edgekit-", parent: str | Path | None = None) -> Iterator[Path]:
    """A scratch folder (in TMPDIR unless ``parent``), removed on exit, on errors and on SIGTERM/SIGINT (the CLI
    turns those into exceptions); after a SIGKILL the next run's :func:`sweep_stale` removes it."""
    parent = Path(parent or tempfile.gettempdir())
    sweep_stale(parent, "edgekit-")  # every kind of edgekit work folder (bundle, plan, calib ...) a killed run left
    made: dict = {}
    try:
        _new_locked(parent, prefix, made)
        yield made["path"]
    finally:  # also when a signal lands while the folder is being made
        if "path" in made:
            scratch_removed.append(made["path"])
        _unmake(made)


def _new_locked(parent: Path, prefix: str, made: dict) -> None:
    """A new empty folder ``parent/<prefix><random>`` with its held lock file beside it, recorded in ``made``
    (``fd`` and ``lock`` as soon as the lock is held, ``path`` just before the folder is made), so that a caller's
    cleanup finds them even when a signal's exception lands between two steps here."""
    import secrets

    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        lock = path.with_name(path.name + LOCK_SUFFIX)
        try:
            made["fd"], made["lock"] = _hold_lock(lock), lock
        except FileExistsError:
            continue
        made["path"] = path  # before the mkdir: a signal landing right after it still finds it (the lock is ours)
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:  # not ours: forget it before anything removes it
            made.pop("path")
            _release(made.pop("fd"), made.pop("lock"))
            continue
        return
    raise OutputError(f"cannot create a work folder in {parent}")  # pragma: no cover


def _unmake(made: dict) -> None:
    """Remove what :func:`_new_locked` made (the folder, then the lock)."""
    if "path" in made:
        shutil.rmtree(made["path"], ignore_errors=True)
    if "fd" in made:
        _release(made["fd"], made["lock"])


# ---------------------------------------------------------------- outputs: replace only what edgekit wrote


def foreign_files(folder: Path) -> list[str] | None:
    """What in ``folder`` edgekit did not write: None when it is an edgekit output exactly as written (a
    ``manifest.json`` with edgekit's schema listing every file, with matching sizes, and nothing else);
    else the entries that make it foreign (all of them when there is no edgekit manifest)."""
    folder = Path(folder)
    found: dict[str, Path] = {}
    odd: list[str] = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            odd.append(rel)
        elif p.is_file():
            found[rel] = p
    man = None
    mpath = folder / MARKER
    if MARKER in found and mpath.stat().st_size <= (64 << 20):
        import json

        with contextlib.suppress(ValueError, OSError):
            man = json.loads(mpath.read_text())
    ours = isinstance(man, dict) and (man.get("schema_version") == 2 or man.get("schema") == 1)  # schema 1: an older edgekit
    files = man.get("files") if ours else None
    if not isinstance(files, dict):
        return sorted(found) + odd
    foreign = list(odd)
    for rel, p in found.items():
        info = files.get(rel)
        if rel == MARKER:
            continue
        if not isinstance(info, dict) or info.get("bytes") != p.stat().st_size:
            foreign.append(rel)
    return sorted(foreign) if foreign else None


def check_replaceable(dest: Path, flag: str = "-o") -> None:
    """``dest`` may be replaced: it does not exist, is an empty folder, or is an edgekit output as written."""
    if not (dest.exists() or dest.is_symlink()):
        return
    if dest.is_symlink() or not dest.is_dir():
        raise OutputError(f"{dest} exists and is not a folder; choose another output folder with {flag}")
    if not any(dest.iterdir()):
        return
    foreign = foreign_files(dest)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise OutputError(
            f"{dest} is not an edgekit output: it holds files edgekit did not write ({shown}); edgekit replaces "
            f"only its own outputs: choose another folder with {flag}"
        )


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``dest``; on success it replaces ``dest``.

    A failed run leaves ``dest`` as it was and removes the sibling; a killed run leaves only a
    ``.<name>.tmp-*`` folder with a lock file, which the next run removes. An existing ``dest`` is replaced
    only if it is empty or an edgekit output exactly as edgekit wrote it (:func:`foreign_files`); a folder
    holding anything else is refused with the list of foreign files, and nothing in it is touched.
    """
    dest = Path(os.path.abspath(dest))
    check_replaceable(dest)
    made: dict = {}
    try:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            prefix = f".{dest.name}.tmp-"
            sweep_stale(dest.parent, prefix)
            _new_locked(dest.parent, prefix, made)
        except (FileExistsError, NotADirectoryError) as exc:
            raise OutputError(f"cannot create {dest}: {exc.filename or dest.parent} is not a folder; "
                              "choose another output folder with -o") from None
        except PermissionError:
            raise OutputError(f"cannot write in {dest.parent} (permission denied); choose another output folder "
                              "with -o") from None
        except OSError as exc:
            raise OutputError(f"cannot write in {dest.parent} ({exc.strerror}); choose another output folder "
                              "with -o") from None
        tmp = made["path"]
        yield tmp
        check_stop()
        check_replaceable(dest)  # again: something may have appeared in it while we worked
        old = None
        if dest.exists():
            old = tmp.with_name(tmp.name + ".old")
            os.replace(dest, old)
        os.replace(tmp, dest)
        made.pop("path")  # it is dest now
        written.append(dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:  # a failed or stopped run (a signal may land while the sibling is being made) leaves no sibling
        if "path" in made:
            abandoned.append(dest)
        _unmake(made)


def file_mode() -> int:
    """The mode a plain new file gets under the user's umask (mkstemp makes 0600: a bundle or report written
    through a temporary sibling would otherwise be unreadable to the user's other accounts and tools)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(dest: Path, data: bytes) -> None:
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, file_mode())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
