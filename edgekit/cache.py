"""The content-addressed build cache: a verified build is stored under the hash of everything it depends on,
and a later ``convert`` with the same inputs copies it into ``-o`` without importing any ML framework.

The key (sha256) covers the source model's bytes (a folder model: its files), the calibration and eval data's
bytes, the target and board profiles as loaded (``--set`` overrides included) and the board's calibrated cost
model, the precision and every option, edgekit's version and code (the package, converters and firmware, so an
edited checkout never serves an old build), the toolchains' versions (read with importlib.metadata, never by
importing them) and the host platform. The paths as given are in it too: the manifest records them.

Not cached: a ``pkg.module:factory`` model or one loaded with ``--trust-pickle`` (code outside the file that the
key cannot hash), an already loaded Model (the planner's builds), and builds whose verification failed (a failed
build is rebuilt every time, so its report is always today's).

Layout under the cache folder (``--cache-dir``, ``$EDGEKIT_CACHE_DIR``, else ``cache/`` in edgekit's data folder):

    builds/<key>/build/...      the verified output folder, as written (manifest.json lists every file's sha256)
    builds/<key>/entry.json     what ``edgekit cache ls`` shows, and the result's stats / notes; its mtime = last use
    analysis/<key>/...          the float export and analysis of one model for one target (no precision in the key)
    sensitivity/<key>/entry.json  the INT8 layer search's scores of one model and calibration data for one target's
                                scheme (no board in the key; edgekit.mixed.scores)

Entries are written into a locked temporary sibling and renamed into place, so two processes sharing the folder
never see half an entry; a hit re-checks every file's sha256 and drops an entry that no longer matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from edgekit.errors import InputSpecError
from edgekit.fsutil import atomic_dir, data_dir, data_root, sha256_file, sha256_tree, work_dir

ENV = "EDGEKIT_CACHE_DIR"
SCHEMA = 2
ENTRY = "entry.json"
# every toolchain a converter may use: an upgrade of any of them is a new key (read from metadata, not imported)
TOOLCHAINS = ("numpy", "torch", "onnx", "onnxruntime", "onnxslim", "onnxscript", "tensorrt",
              "litert-torch", "litert-converter", "ai-edge-litert", "ai-edge-quantizer", "torchao", "tensorflow",
              "tensorflow-cpu", "keras", "tf-keras", "tf2onnx", "coremltools", "scikit-learn", "brevitas", "qonnx", "onnxoptimizer", "hls4ml")
_said: set[str] = set()  # reasons a build is not cached, said once per process


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` (the CLI's ``--cache-dir``), else ``$EDGEKIT_CACHE_DIR``, else ``<data folder>/cache``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    return data_root() / "cache"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


_env_cache: dict[str, Any] = {}


def environment() -> dict[str, Any]:
    """edgekit's version and code, the toolchains' versions and the host: the part of every key that does not
    depend on the build (computed once per process)."""
    if not _env_cache:
        from edgekit import __version__
        from edgekit.deps import toolchain_versions

        h = hashlib.sha256()
        for kind in ("edgekit", "converters", "firmware"):
            root = Path(__file__).parent if kind == "edgekit" else data_dir(kind)
            for p in sorted(root.rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                    h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
        _env_cache.update(edgekit=__version__, code=h.hexdigest(), toolchains=toolchain_versions(*TOOLCHAINS),
                          python=platform.python_version(), platform=f"{sys.platform}-{platform.machine()}")
    return _env_cache


def _onnx_digest(path: Path) -> str:
    """An ONNX file and the external-data files beside it that it names (onnx.load reads those too)."""
    data = path.read_bytes()
    h = hashlib.sha256(data)
    for sib in sorted(path.parent.iterdir())[:1000]:
        if sib != path and sib.is_file() and sib.name.encode() in data:
            h.update(sib.name.encode() + b"\0" + sha256_file(sib).encode())
    return h.hexdigest()


def _file_part(path: str | None, what: str) -> dict[str, Any] | None:
    if path is None or path == "random":
        return None if path is None else {"random": True}
    p = Path(path)
    if not p.exists():  # the ingest stage names the problem; no key without the bytes
        raise InputSpecError(f"{what} {path}: no such file")
    return {"path": str(path), "sha256": _onnx_digest(p) if p.suffix.lower() == ".onnx" else sha256_tree(p)}


def _stats(d: dict[str, Any]) -> Any:
    from edgekit.analyze import LayerStats, ModelStats

    return ModelStats(**{**d, "layers": [LayerStats(**lay) for lay in d["layers"]]})


def _say_once(reason: str, log: Callable[[str], None]) -> None:
    if reason not in _said:
        _said.add(reason)
        log(f"build cache: {reason}")


@dataclass
class BuildCache:
    """The cache as one convert call sees it: its folder and its two keys (None: that part is not cached)."""

    root: Path
    key: str
    analysis_key: str
    what: dict[str, Any]  # model, target, board, precision: what `edgekit cache ls` shows

    # ------------------------------------------------------------ the whole build

    def restore(self, out: Path | None, default_out: Callable[[dict[str, Any]], Path],
                log: Callable[[str], None]) -> tuple[Path, dict[str, Any], dict[str, Any]] | None:
        """A verified build of this key copied (hard-linked where the file system allows) into ``out`` through
        the atomic output path; returns (out, manifest, entry) or None on a miss."""
        entry_dir = self.root / "builds" / self.key
        try:
            entry = json.loads((entry_dir / ENTRY).read_text())
            manifest_bytes = (entry_dir / "build" / "manifest.json").read_bytes()
        except (OSError, ValueError):
            return None
        manifest = json.loads(manifest_bytes)
        build = entry_dir / "build"
        files = [*manifest.get("files", {}), "manifest.json"]
        bad = hashlib.sha256(manifest_bytes).hexdigest() != entry.get("manifest_sha256") or any(
            not (build / rel).is_file() or sha256_file(build / rel) != info["sha256"]
            for rel, info in manifest.get("files", {}).items())
        if bad:  # changed after it was stored (a hard-linked output edited in place?): drop it and rebuild
            log(f"build cache: entry {self.key[:12]} no longer matches its hashes; removed, rebuilding")
            _remove(entry_dir)
            return None
        dest = Path(out) if out is not None else default_out(manifest)
        with atomic_dir(dest) as tmp:
            for rel in files:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(build / rel, tmp / rel)
        os.utime(entry_dir / ENTRY)  # last use: prune drops the least recently used first
        return dest.resolve(), manifest, entry

    def store(self, out_dir: Path, stats: dict[str, Any], notes: list[str]) -> None:
        """Store the verified build in ``out_dir`` (as just written) under this key."""
        manifest_bytes = (out_dir / "manifest.json").read_bytes()
        manifest = json.loads(manifest_bytes)
        entry = {"schema": SCHEMA, "key": self.key, **self.what, "precision": manifest.get("precision"),
                 "built_utc": manifest.get("created_utc"), "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
                 "stats": stats, "notes": notes}

        def fill(tmp: Path) -> None:
            for rel in [*manifest.get("files", {}), "manifest.json"]:
                (tmp / "build" / rel).parent.mkdir(parents=True, exist_ok=True)
                _link_or_copy(out_dir / rel, tmp / "build" / rel)
            entry["bytes"] = _size(tmp)
            (tmp / ENTRY).write_text(json.dumps(entry, indent=1) + "\n")

        _publish(self.root / "builds", self.key, fill)

    # ------------------------------------------------------------ the float export and analysis

    def analysis(self, model: Any, target: Any, work: Path, opset: int | None,
                 log: Callable[[str], None]) -> tuple[Any, Path]:
        """``analyze_model(model, work, target, opset)``, from the cache when this model was analyzed for this
        target before (at any precision); the float graph lands in ``work`` as the analysis would write it."""
        from edgekit.analyze import analyze_model

        entry_dir = self.root / "analysis" / self.analysis_key
        try:
            meta = json.loads((entry_dir / ENTRY).read_text())
            for name in meta["files"]:
                shutil.copy2(entry_dir / name, work / name)  # copied: a converter may rewrite its input
            stats = _stats(meta["stats"])
            os.utime(entry_dir / ENTRY)
            log(f"analysis: from the build cache ({self.analysis_key[:12]}, float export skipped)")
            return stats, work / meta["graph"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        stats, graph = analyze_model(model, work, target, opset)
        if Path(graph).parent == work:  # torch / Keras: the export is ours to keep (an ONNX model is its own file)
            names = sorted(p.name for p in work.iterdir() if p.is_file() and p.name.startswith(Path(graph).name))
            meta = {"schema": SCHEMA, "key": self.analysis_key, "kind": "analysis", **self.what, "precision": None,
                    "built_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "graph": Path(graph).name,
                    "files": names, "stats": stats.to_json()}

            def fill(tmp: Path) -> None:
                for name in names:
                    shutil.copy2(work / name, tmp / name)
                meta["bytes"] = _size(tmp)
                (tmp / ENTRY).write_text(json.dumps(meta) + "\n")

            try:
                _publish(self.root / "analysis", self.analysis_key, fill)
            except OSError as exc:  # a full or read-only cache never fails a build
                log(f"build cache: analysis not stored ({exc})")
        return stats, graph


def cached_build(bc: BuildCache | None, out: str | Path | None, default_root: str | Path,
                 log: Callable[[str], None], warn: Callable[[str], None]) -> tuple[Any, ...] | None:
    """A verified build of this call's key restored into ``out`` (default: ``default_root/<its name>``): the fields
    of its ConvertResult (:func:`hit_result`); None on a miss or where the call is not cached (``bc`` None)."""
    if bc is None:
        return None
    hit = bc.restore(Path(out) if out is not None else None, lambda man: Path(default_root) / man["name"], log)
    return hit_result(bc, *hit, warn) if hit is not None else None


def store_build(bc: BuildCache | None, out_dir: Path, stats: dict[str, Any], notes: list[str],
                manifest: dict[str, Any], warn: Callable[[str], None]) -> dict[str, Any] | None:
    """A verified build just written to ``out_dir`` stored under this call's key; the result's ``cache`` part, or
    None where it is not cached. A full or read-only cache folder never fails a finished conversion: it warns."""
    if bc is None:
        return None
    try:
        bc.store(out_dir, stats, notes)
    except OSError as exc:
        warn(f"build cache not updated: {exc}")
        return None
    return {"hit": False, "key": bc.key, "built_utc": manifest.get("created_utc")}


def hit_result(bc: BuildCache, out: Path, manifest: dict[str, Any], entry: dict[str, Any],
               warn: Callable[[str], None]) -> tuple[Any, ...]:
    """The fields of a cache hit's ConvertResult, as the build that was stored returned them (its warnings said
    again)."""
    from edgekit.verify import OutputCheck, Verification

    def back(d: dict[str, Any]) -> dict[str, Any]:  # JSON made the Wilson intervals lists
        return {k: tuple(x) if k.endswith("_ci95") and isinstance(x, list) else x for k, x in d.items()}

    v = {k: x for k, x in back(manifest["verification"]).items() if k != "passed"}  # a property there
    verification = Verification(**{**v, "outputs": [OutputCheck(**back(o)) for o in v["outputs"]]})
    stats = _stats(entry["stats"])
    for w in manifest.get("warnings", []):
        warn(w)
    return (out, manifest, verification, stats, dict(manifest.get("timings_s") or {}),
            list(manifest.get("warnings", [])), list(entry.get("notes", [])),
            {"hit": True, "key": bc.key, "built_utc": entry.get("built_utc")})


def open_cache(model: Any, target: Any, board: Any, precision: str, *, calib: str | None, eval_data: str | None,
               input_shape: list[str] | None, consts: list[str] | None, trust_pickle: bool, opset: int | None,
               golden_count: int, options: dict[str, Any] | None, output_kinds: dict[str, str] | None,
               eval_output: str | None, cache_dir: str | Path | None = None,
               log: Callable[[str], None] = lambda m: None, strict: bool = False,
               allow_slower_int8: bool = False, search_budget_s: float | None = None,
               batch_axes: list[str] | None = None, carries: list[str] | None = None,
               sequence_length: int | None = None) -> BuildCache | None:
    """The cache for one convert call, its keys computed from the inputs' bytes; None when this build cannot be
    cached (said once per process, with the reason). ``strict`` (--strict: no mixed-precision build) and
    ``allow_slower_int8`` (the speed verdict waived) are keys of their own."""
    from edgekit.calibration_store import load_fit
    from edgekit.ingest import FACTORY_RE, Model

    if isinstance(model, Model):
        return None  # a caller that loaded the model itself (the planner) gives no bytes to hash
    src = str(model)
    if not Path(src).exists() and FACTORY_RE.match(src):
        _say_once("a pkg.module:factory model is code, not bytes: not cached", log)
        return None
    if trust_pickle:
        _say_once("a model loaded with --trust-pickle runs code outside its file: not cached", log)
        return None
    if not Path(src).exists():
        return None  # ingest names the problem
    env = environment()
    model_part = _file_part(src, "model")
    loading = {"model": model_part, "input_shape": input_shape, "consts": consts, "env": env,
               **({"batch_axes": sorted(batch_axes)} if batch_axes else {})}  # absent: the keys of older builds
    if (options or {}).get("keras") == "onnx":  # another float graph: the tf2onnx route is analyzed on its own
        loading["route"] = "keras-onnx"
    analysis_key = _digest({"schema": SCHEMA, "stage": "analysis", **loading,
                            "target": target.model_dump(mode="json", exclude={"tolerances"}), "opset": opset})
    key = _digest({
        "schema": SCHEMA, "stage": "build", **loading, "analysis": analysis_key,
        "calib": _file_part(calib, "--calib"), "eval": _file_part(eval_data, "--eval"),
        **({"carry": list(carries), "sequence_length": sequence_length} if carries else {}),  # the data's order
        "target": target.model_dump(mode="json"), "board": board.model_dump(mode="json"),  # overrides included
        "board_fit": load_fit(board.id),  # the calibrated cost model: the plan and its estimate read it
        "precision": precision, "opset": opset, "golden": golden_count, "options": options,
        "output_kinds": output_kinds, "eval_output": eval_output, **({"strict": True} if strict else {}),
        **({"allow_slower_int8": True} if allow_slower_int8 else {}),
        **({"search_budget_s": search_budget_s} if search_budget_s is not None else {}),
    })
    what = {"kind": "build", "model": src, "target": target.name, "board": board.id}
    return BuildCache(cache_root(cache_dir), key, analysis_key, what)


# ---------------------------------------------------------------- the folder: entries, ls, prune


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(src, dst)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _publish(parent: Path, key: str, fill: Callable[[Path], None]) -> None:
    """Build ``parent/<key>`` in a locked temporary sibling and rename it into place; an entry another process
    published first is kept (same key, same content)."""
    parent.mkdir(parents=True, exist_ok=True)
    if (parent / key / ENTRY).is_file():
        return
    with work_dir("edgekit-entry-", parent=parent) as tmp:
        fill(tmp)
        try:
            os.rename(tmp, parent / key)
        except OSError:
            if not (parent / key / ENTRY).is_file():
                raise


def _remove(entry_dir: Path) -> None:
    """Remove a cache entry: renamed out of sight first, so no reader ever sees it half removed."""
    gone = entry_dir.with_name(f"edgekit-gone-{entry_dir.name}-{os.getpid()}")
    try:
        os.rename(entry_dir, gone)
    except OSError:
        return
    shutil.rmtree(gone, ignore_errors=True)


@dataclass
class Entry:
    path: Path
    kind: str  # build | analysis | sensitivity
    key: str
    model: str
    target: str
    board: str | None
    precision: str | None
    bytes: int
    built_utc: str | None
    last_used: float


def entries(cache_dir: str | Path | None = None) -> list[Entry]:
    """Every complete entry in the cache, least recently used first."""
    root = cache_root(cache_dir)
    found = []
    for kind in ("builds", "analysis", "sensitivity"):
        folder = root / kind
        if not folder.is_dir():
            continue
        for d in folder.iterdir():
            meta_path = d / ENTRY
            try:
                meta = json.loads(meta_path.read_text())
                used = meta_path.stat().st_mtime
            except (OSError, ValueError):
                continue  # a temporary sibling being written, or not ours
            found.append(Entry(d, "build" if kind == "builds" else kind, d.name, meta.get("model", "?"),
                               meta.get("target", "?"), meta.get("board") if kind == "builds" else None,
                               meta.get("precision"), int(meta.get("bytes") or 0), meta.get("built_utc"), used))
    return sorted(found, key=lambda e: e.last_used)


def prune(max_gb: float, cache_dir: str | Path | None = None) -> tuple[list[Entry], int]:
    """Remove the least recently used entries until the cache holds at most ``max_gb`` GB; returns the removed
    entries and the bytes left."""
    import math

    if not math.isfinite(max_gb) or max_gb < 0:
        raise InputSpecError(f"--max-gb {max_gb}: give the size to keep, in GB (0 empties the cache)")
    found = entries(cache_dir)
    total = sum(e.bytes for e in found)
    limit = round(max_gb * 1e9)  # round, not int(): 12345 / 1e9 * 1e9 is 12344.999…
    removed = []
    for e in found:
        if total <= limit:
            break
        _remove(e.path)
        total -= e.bytes
        removed.append(e)
    return removed, total


def age(utc: str | None, now: float | None = None) -> str:
    """``3 min``, ``5 h``, ``2 d`` since an ISO UTC time."""
    if not utc:
        return "?"
    try:
        then = datetime.strptime(utc, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return "?"
    s = max(0.0, (now or time.time()) - then)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f} {unit}"
    return f"{s:.0f} s"
