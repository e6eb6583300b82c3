"""Sensitivity scores cached per model and calibration data: a second INT8 build of the same model with the same
calibration data (for another board of the same target, or another run) reuses the layer search's measurements
instead of building every kept set again.

What is stored (one entry per key, beside the build cache: ``<cache folder>/sensitivity/<key>/entry.json``): the
search's candidate layers with their ranking, and every kept set the search measured: its output SNR on the search
samples, whether the target's checks passed there, the seconds its build took, and the calibration method measured
best with it (where the converter measures several). With every set the search asks for in the entry, the
converter's search is not even set up (its calibration and ranking pass): only the chosen set is built, and
verified for real as always.

The key covers everything the scores depend on: the model (its digest and input / output spec; for a model whose
file does not hold its code, a ``pkg.module:factory`` or a pickle, and for an ONNX model as prepared, the float
graph the converter starts from), the calibration samples (the arrays themselves, after the golden / eval samples
were held out), the target's quantization scheme (the converter, the target profile, the precision, every
``--option``, the scheme the first INT8 build recorded: its calibration method, per-channel or not ...), the
checks that decide "passes" (the tolerances and output kinds), and edgekit's code and the toolchains' versions
(as the build cache's key). Not the board: two boards of one target share the scores. ``--no-cache`` neither reads
nor writes them; ``edgekit cache ls`` lists them (kind ``sensitivity``) and ``prune`` removes them like builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.mixed.search import Layer, Score, Search

# 2: jetson measures each layer alone on 8 samples (was 32); 3: android / ios measure a layer kept alone with the
# first build's observer only, and a layer records whether it reads a model input (scanned first)
SCHEMA = 3
FOLDER = "sensitivity"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def data_digest(ds: Any) -> str:
    """sha256 of a Dataset's arrays (names, dtypes, shapes, bytes) and labels: the samples the search draws from."""
    h = hashlib.sha256()
    arrays = sorted(ds.inputs.items())
    if ds.labels is not None:
        arrays.append(("\0label", ds.labels))
    for name, a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{name}\0{a.dtype.str}\0{list(a.shape)}\0".encode())
        h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def model_part(job: Any) -> dict[str, Any]:
    """The model as the key sees it: digest, kind, input / output spec; the float graph's bytes where the model's
    digest does not cover what runs (code outside the file, an ONNX model as prepared)."""
    from edgekit.cache import _onnx_digest
    from edgekit.fsutil import sha256_file

    m = job.model
    part: dict[str, Any] = {"sha256": m.sha256, "kind": m.kind, "bridge": m.bridge,
                            "inputs": [s.to_json() for s in m.inputs], "outputs": [s.to_json() for s in m.outputs]}
    if m.kind in ("factory", "pickle", "onnx"):
        graph = job.float_onnx or m.onnx_path or job.float_tflite
        if graph is not None and Path(graph).is_file():
            part["graph"] = _onnx_digest(Path(graph)) if Path(graph).suffix == ".onnx" else sha256_file(Path(graph))
    return part


def scheme(meta: dict[str, Any]) -> dict[str, Any]:
    """The quantization scheme the first INT8 build recorded (``artifact.meta``): its ``quantization`` record's
    words and flags (tool, weights, activations, calibration method, bias correction applied ...), not its
    measurements (floats) or where the data came from; and the ops it kept fp32 (Core ML W8A8)."""
    def plain(d: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k.endswith("_source") or isinstance(v, float):
                continue
            if isinstance(v, dict):
                v = plain(v)
            elif isinstance(v, list) and not all(isinstance(x, (str, int, bool)) for x in v):
                continue
            out[k] = v
        return out

    return {"quantization": plain(meta.get("quantization") or {}), "fp32_ops": meta.get("fp32_ops")}


def score_key(job: Any, artifact: Any, tol: Any, kinds: dict[str, str], label: str) -> str:
    from edgekit.cache import environment

    return _digest({
        "schema": SCHEMA, "model": model_part(job), "calib": data_digest(job.calib), "label": label,
        "converter": job.target.converter, "target": job.target.model_dump(mode="json"), "precision": job.precision,
        "options": job.options, "opset": job.opset, "scheme": scheme(artifact.meta),
        "tolerance": tol.model_dump(mode="json"), "kinds": kinds, "env": environment(),
    })


@dataclass
class ScoreStore:
    """The sensitivity scores of one search, as the cache held them when it began (``entry`` None: none), and
    every set measured since (``scores``, shared with :func:`edgekit.mixed.search.keep_fewest`)."""

    folder: Path  # <cache folder>/sensitivity/<key>
    key: str
    what: dict[str, Any]  # model, target, precision: what `edgekit cache ls` shows
    entry: dict[str, Any] | None
    scores: dict[tuple[str, ...], Score] = field(default_factory=dict)
    calibration: dict[tuple[str, ...], str] = field(default_factory=dict)
    setup_s: float = 0.0  # the converter's search set-up (calibration, ranking) when it was built

    @classmethod
    def open(cls, root: Path, job: Any, artifact: Any, tol: Any, kinds: dict[str, str], label: str,
             log: Callable[[str], None]) -> ScoreStore | None:
        """The store of this search's key under the cache folder ``root``; None where the key cannot be made
        (said in the log; the search then runs as without a cache)."""
        try:
            key = score_key(job, artifact, tol, kinds, label)
        except (OSError, TypeError, ValueError) as exc:
            log(f"sensitivity cache: not used ({exc})")
            return None
        folder = Path(root) / FOLDER / key
        entry = None
        try:
            entry = json.loads((folder / "entry.json").read_text())
            if entry.get("schema") != SCHEMA or entry.get("key") != key or not entry.get("layers"):
                entry = None
        except (OSError, ValueError):
            entry = None
        what = {"kind": "sensitivity", "model": job.model.source, "target": job.target.name,
                "precision": job.precision, "label": label}
        store = cls(folder, key, what, entry)
        if entry is not None:
            for s in entry.get("scores", []):
                k = tuple(sorted(s["kept"]))
                store.scores[k] = {"snr_db": float(s["snr_db"]), "passed": bool(s["passed"]), "s": float(s["s"])}
                if s.get("calibration"):
                    store.calibration[k] = s["calibration"]
            store.setup_s = float(entry.get("setup_s") or 0.0)
            os.utime(folder / "entry.json")  # last use: prune drops the least recently used first
        return store

    def search(self, build: Callable[[], Search]) -> Search:
        """The search to run: the cached one (the converter's built only where a set is not in the cache), or
        ``build()`` timed where the cache holds none."""
        if self.entry is not None:
            return CachedSearch(self, build)
        t0 = time.perf_counter()
        search = build()
        self.setup_s = round(time.perf_counter() - t0, 3)
        return search

    def saved_s(self, outcome: Any, search: Search) -> float:
        """What the cached scores saved: the time they took to measure, and the set-up where it was skipped."""
        skipped = isinstance(search, CachedSearch) and not search.built
        return round(outcome.saved_s + (self.setup_s if skipped else 0.0), 1)

    def save(self, search: Search, measured_before: set[tuple[str, ...]]) -> None:
        """Write the entry: the layers and every score held now (the cache's and this search's). Atomic (a temporary
        sibling renamed over it); nothing is written where the search measured nothing new."""
        new = set(self.scores) - measured_before
        if not new:
            return
        cal = search.calibration_for
        if cal is not None:
            for k in new:
                method = cal(list(k))
                if method:
                    self.calibration[k] = method
        real = search.real if isinstance(search, CachedSearch) else search
        samples = search.samples() if real is not None else int(self.entry["samples"])
        entry = {
            "schema": SCHEMA, "key": self.key, **self.what, "board": None,
            "built_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "layers": [{"name": lay.name, "op": lay.op, "local_sqnr_db": lay.local_sqnr_db,
                        **({"reads_input": True} if lay.reads_input else {})} for lay in search.layers],
            "keeps_as": search.keeps_as, "by_rank": search.by_rank, "samples": samples,
            "calibrates": cal is not None, "setup_s": self.setup_s,
            "scores": [{"kept": list(k), **v, **({"calibration": self.calibration[k]} if k in self.calibration else {})}
                       for k, v in sorted(self.scores.items())],
        }
        from edgekit.fsutil import atomic_write_bytes

        entry["bytes"] = len(json.dumps(entry, indent=1)) + 20  # what `edgekit cache ls` shows (the line below's size)
        atomic_write_bytes(self.folder / "entry.json", json.dumps(entry, indent=1).encode() + b"\n")


class CachedSearch(Search):
    """A search from the sensitivity cache: its layers and ranking as stored; ``outputs`` / ``reference`` build the
    converter's own search on first use (a kept set the cache does not hold), and ``calibration_for`` answers from
    the cache first."""

    def __init__(self, store: ScoreStore, build: Callable[[], Search]) -> None:
        e = store.entry or {}
        self.layers = [Layer(d["name"], d["op"], float(d["local_sqnr_db"]), reads_input=bool(d.get("reads_input")))
                       for d in e["layers"]]
        self.keeps_as, self.by_rank = e["keeps_as"], bool(e["by_rank"])
        self._store, self._build = store, build
        self._calibrates, self._samples = bool(e.get("calibrates")), int(e["samples"])
        self.real: Search | None = None

    @property
    def built(self) -> bool:
        return self.real is not None

    def _real(self) -> Search:
        if self.real is None:
            t0 = time.perf_counter()
            self.real = self._build()
            self._store.setup_s = round(time.perf_counter() - t0, 3)
        return self.real

    @property  # type: ignore[override]
    def outputs(self) -> Callable[[list[str]], list[np.ndarray]]:
        return self._real().outputs

    @property  # type: ignore[override]
    def reference(self) -> list[np.ndarray]:
        return self._real().reference

    @property  # type: ignore[override]
    def calibration_for(self) -> Callable[[list[str]], str | None] | None:
        if not self._calibrates:
            return None

        def method(kept: list[str]) -> str | None:
            key = tuple(sorted(kept))
            if key in self._store.calibration:
                return self._store.calibration[key]
            cal = self.real.calibration_for if self.real is not None else None
            return cal(kept) if cal is not None else None

        return method

    def samples(self) -> int:
        return int(self._samples) if self.real is None else self.real.samples()
