"""`edgekit matrix SPEC.toml`: models × boards × precisions, each cell one independent convert.

    [[models]]                                # one table per model
    name = "digits"
    path = "examples/digits/digits_cnn.pt2"   # paths are relative to the spec file
    calib = "examples/digits/calib.npz"
    eval = "examples/digits/eval.npz"

    [[boards]]
    board = "nvidia/jetson-orin-nano-8gb"     # target: the board's first one unless given (or `target` at the top)

    precisions = ["fp32", "int8"]             # top level

    [[cells]]                                 # per-cell overrides: selectors (model / board / precision) + changes
    model = "digits"
    precision = "int8"
    tolerance = { max_accuracy_drop_points = 2.0 }

A cell runs in its own process (a crash or a hang stays in its cell): by default a bounded pool of them on this
machine, with ``ray`` each cell is a Ray task on a Ray cluster, which starts the same process on its node. Each
cell calls :func:`edgekit.pipeline.convert`, so every cell gets what convert gets (the build cache among it).
Each cell's outcome is pass / failed (verification) / refused (edgekit's one-line error) / error (anything else;
the traceback stays in the cell's log file) / skipped (the board does not take the target). The driver writes
``matrix.json``, ``matrix.html`` and one ``matrix`` event per cell into the results store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgekit.errors import MatrixSpecError

STATUSES = ("pass", "failed", "refused", "error", "skipped")
FAILING = ("failed", "error")  # the run exits non-zero when a cell ends so
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Changes(_Strict):
    """What a model, a board or a cell override may change in a cell's convert call."""

    options: dict[str, Any] = Field(default_factory=dict, description="converter options (convert --option)")
    set: list[str] = Field(default_factory=list, description="board overrides key=value (convert --set)")
    tolerance: dict[str, bool | float] = Field(default_factory=dict, description="fields of the precision's tolerance")


class ModelSpec(Changes):
    name: str = Field(pattern=_NAME)
    path: str = Field(min_length=1, description="model file (relative to the spec) or pkg.module:factory")
    calib: str | None = None
    eval: str | None = None
    input_shape: list[str] = Field(default_factory=list)
    consts: list[str] = Field(default_factory=list)
    output_kinds: dict[str, str] = Field(default_factory=dict)
    eval_output: str | None = None
    golden: int = Field(default=64, ge=1)


class BoardSpec(Changes):
    board: str = Field(min_length=1)
    target: str | None = None
    name: str | None = Field(default=None, pattern=_NAME, description="column label (default: the board's name)")

    @property
    def label(self) -> str:
        return self.name or self.board.rsplit("/", 1)[-1]


class CellOverride(Changes):
    model: str | None = None
    board: str | None = None  # a board's label
    precision: str | None = None

    def matches(self, model: str, board: str, precision: str) -> bool:
        return all(want is None or want == got for want, got in
                   ((self.model, model), (self.board, board), (self.precision, precision)))


class Spec(_Strict):
    models: list[ModelSpec] = Field(min_length=1)
    boards: list[BoardSpec] = Field(min_length=1)
    precisions: list[str] = Field(min_length=1)
    target: str | None = Field(default=None, description="target of every board that names none")
    cells: list[CellOverride] = Field(default_factory=list)
    cell_timeout_s: float = Field(default=1800, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _board_strings(cls, data: Any) -> Any:  # boards = ["host", ...] is short for [{board = "host"}, ...]
        if isinstance(data, dict) and isinstance(data.get("boards"), list):
            data = {**data, "boards": [{"board": b} if isinstance(b, str) else b for b in data["boards"]]}
        return data

    @model_validator(mode="after")
    def _unique(self) -> Spec:
        for what, names in (("models", [m.name for m in self.models]), ("boards", [b.label for b in self.boards]),
                            ("precisions", self.precisions)):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{what}: {', '.join(dup)} given twice (boards: give each a distinct `name`)")
        for i, c in enumerate(self.cells):
            for key, known in (("model", [m.name for m in self.models]), ("board", [b.label for b in self.boards]),
                               ("precision", self.precisions)):
                if getattr(c, key) is not None and getattr(c, key) not in known:
                    raise ValueError(f"cells.{i}.{key}: {getattr(c, key)!r} is none of the spec's {key}s ({known})")
        return self


def load_spec(path: str | Path) -> Spec:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise MatrixSpecError(f"{path}: no such file; give the matrix spec (docs/matrix.md)") from None
    except tomllib.TOMLDecodeError as exc:
        raise MatrixSpecError(f"{path}: not valid TOML ({exc}); fix the file") from None
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e["loc"]) or "(file)"
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {'not a matrix spec field' if e['type'] == 'extra_forbidden' else msg}")
        raise MatrixSpecError(f"{path}: invalid matrix spec: " + "; ".join(parts)) from None


# ---------------------------------------------------------------- cells


def _rel(base: Path, p: str | None) -> str | None:
    """A path of the spec relative to the spec's folder; ``random`` and ``pkg.module:factory`` stay as given."""
    if p is None or p == "random" or (":" in p and not (base / p).exists()):
        return p
    return str((base / p).resolve())


def plan_cells(spec: Spec, spec_path: str | Path, out: str | Path) -> list[dict[str, Any]]:
    """Every cell as a JSON-able dict: what its worker needs (the convert call, its folders) and, for a board that
    does not take the target, its result already (skipped)."""
    from edgekit.converters import check_options
    from edgekit.profiles import load_board, load_target, override_tolerances

    base = Path(spec_path).resolve().parent
    out = Path(out).resolve()
    for t in {b.target or spec.target for b in spec.boards} - {None}:
        load_target(t)  # an unknown target is one line, before anything runs
    cells = []
    for m in spec.models:
        for b in spec.boards:
            board = load_board(b.board)  # unknown board: one line, before anything runs
            target = b.target or spec.target or board.targets[0]
            for p in spec.precisions:
                cid = f"{m.name}-{b.label}-{p}"
                over = [c for c in spec.cells if c.matches(m.name, b.label, p)]
                layers = [m, b, *over]  # later layers win
                cell = {
                    "id": cid, "model": m.name, "board": b.label, "board_id": board.id, "target": target,
                    "precision": p, "out": str(out / "builds" / cid), "log": str(out / "logs" / f"{cid}.log"),
                    "sys_path": str(base), "timeout_s": spec.cell_timeout_s,
                    "convert": {
                        "model": _rel(base, m.path), "target": target, "board": board.id, "precision": p,
                        "calib": _rel(base, m.calib), "eval_data": _rel(base, m.eval),
                        "input_shape": m.input_shape or None, "consts": m.consts or None,
                        "output_kinds": m.output_kinds or None, "eval_output": m.eval_output, "golden_count": m.golden,
                        "options": {k: v for lay in layers for k, v in lay.options.items()} or None,
                        "board_set": [s for lay in layers for s in lay.set] or None,
                        "tolerance": {k: v for lay in layers for k, v in lay.tolerance.items()} or None,
                    },
                }
                if target in board.targets:  # every override is checked here, before any cell runs
                    conv = cell["convert"]
                    load_board(board.id, conv["board_set"])
                    tgt = load_target(target)
                    check_options(tgt.converter, conv["options"])
                    if conv["tolerance"]:
                        override_tolerances(tgt, conv["tolerance"])
                else:
                    cell["result"] = {"status": "skipped", "reason": f"board {board.id} does not take target "
                                      f"{target!r} (its targets: {', '.join(board.targets)})", "seconds": 0.0}
                cells.append(cell)
    ids = [c["id"] for c in cells]
    if len(set(ids)) < len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise MatrixSpecError(f"{spec_path}: cells {', '.join(dup)} share a name; rename a model or board")
    return cells


# ---------------------------------------------------------------- one cell (in its own process)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Convert one cell in this process and return its result; whatever the toolchains print and any traceback go
    to the cell's log file, never to the screen."""
    import io
    import traceback

    from edgekit import results
    from edgekit.errors import EdgekitError
    from edgekit.pipeline import convert
    from edgekit.quiet import capture_fd2, quiet_python

    if cell.get("results_db"):
        results.use_db(cell["results_db"])
    if cell["sys_path"] not in sys.path:  # a pkg.module:factory next to the spec imports
        sys.path.insert(0, cell["sys_path"])
    log_path = Path(cell["log"])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    fd2 = io.StringIO()
    with open(log_path, "w") as log:
        def say(prefix: str) -> Callable[[str], None]:
            return lambda m: print(f"{prefix}{m}", file=log, flush=True)

        log.write(f"cell {cell['id']}: convert {json.dumps(cell['convert'])}\n")
        try:
            with capture_fd2(fd2), quiet_python():
                res = convert(**cell["convert"], out=cell["out"], fail_on_verification=False, log=say(""),
                              warn=say("warning: "), on_stage=lambda s, m: m != "start" and say("stage ")(f"{s} {m}"))
            out = summarize(res.manifest, res.verification)
            out["cache_hit"] = bool(res.cache and res.cache.get("hit"))
            for w in res.warnings:
                out.setdefault("warnings", []).append(_one_line(w))
        except EdgekitError as exc:
            out = {"status": "refused", "error": type(exc).__name__, "reason": _one_line(exc)}
        except Exception as exc:  # noqa: BLE001 - a bug in one cell must not stop the others: kept in its log
            traceback.print_exc(file=log)
            out = {"status": "error", "error": type(exc).__name__, "reason": _one_line(f"{type(exc).__name__}: {exc}")}
        finally:
            if fd2.getvalue().strip():
                log.write("--- toolchain output (stderr)\n" + fd2.getvalue())
        log.write(f"result: {json.dumps(out, default=str)}\n")
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def summarize(man: dict[str, Any], v: Any) -> dict[str, Any]:
    """A finished build's cell result: verdict, accuracy drop or float agreement, size, estimated latency."""
    from edgekit.results import estimate_from_manifest

    prim = man["artifact"]["primary"]
    agree = [o.top1_agreement for o in v.outputs if o.top1_agreement is not None]
    drop = None
    if v.float_accuracy is not None and v.converted_accuracy is not None:
        drop = round((v.float_accuracy - v.converted_accuracy) * 100, 3)
    return {
        "status": "pass" if v.passed else "failed",
        "reason": None if v.passed else _one_line("; ".join(v.failures) or "an output check failed"),
        "float_accuracy": v.float_accuracy, "converted_accuracy": v.converted_accuracy, "accuracy_drop_points": drop,
        "top1_agreement": min(agree) if agree else None,
        "max_rel_error": max((o.max_rel_error for o in v.outputs), default=None),
        "artifact_bytes": sum(f["bytes"] for k, f in man["files"].items() if k == prim or k.startswith(prim + "/")),
        "estimated_latency_ms": estimate_from_manifest(man), "precision_built": man.get("precision"),
        "runtime": v.runtime, "timings_s": man.get("timings_s"),
    }


def _worker_main(argv: list[str]) -> int:
    """``python -m edgekit.matrix CELL.json RESULT.json``: one cell in this process."""
    from edgekit import fsutil

    def _stop(signum: int, _frame: object) -> None:  # unwind: convert's staging folders are removed on the way out
        fsutil.stop_signal = signum
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _stop)
    cell = json.loads(Path(argv[0]).read_text())
    res = run_cell(cell)
    fsutil.atomic_write_bytes(Path(argv[1]), json.dumps(res, default=str).encode())
    return 0


# ---------------------------------------------------------------- running cells: process pool or Ray


_running: set[subprocess.Popen] = set()  # this process's cell processes, ended when the driver stops


def execute(cell: dict[str, Any], threads: int | None = None) -> dict[str, Any]:
    """Run one cell in a child process (its own interpreter: a crash, a hang or a leak stays in the cell) and
    return its result. Both the local pool and a Ray task call this."""
    import tempfile

    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
    if threads:  # the pool's share of the cores, unless the user set it
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, str(threads))
    log = Path(cell["log"])
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgekit-matrix-") as tmp:
        spec, res = Path(tmp) / "cell.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps(cell))
        with open(Path(tmp) / "out.txt", "w+") as sink:  # what the child prints outside run_cell's capture
            proc = subprocess.Popen([sys.executable, "-m", "edgekit.matrix", str(spec), str(res)],
                                    stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env)
            _running.add(proc)
            try:
                code = proc.wait(timeout=cell["timeout_s"])
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                return {"status": "error", "error": "timeout", "reason": f"no result within {cell['timeout_s']:g} s "
                        "(cell_timeout_s)", "seconds": round(time.perf_counter() - t0, 2)}
            except BaseException:  # Ctrl-C / SIGTERM of the driver: the child goes too
                proc.terminate()
                proc.wait()
                raise
            finally:
                _running.discard(proc)
            sink.seek(0)
            stray = sink.read()
        if stray.strip():
            with open(log, "a") as f:
                f.write("--- the cell's process printed\n" + stray)
        if res.is_file():
            out = json.loads(res.read_text())
        else:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            out = {"status": "error", "error": "crash", "reason": f"the cell's process ended without a result ({how}); "
                   f"see {log}"}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def default_jobs() -> int:
    """Cells at once on this machine: one per two cores (each convert runs multi-threaded), at least one."""
    return max(1, (os.cpu_count() or 2) // 2)


OnDone = Callable[[dict[str, Any], dict[str, Any]], None]


def run_pool(cells: list[dict[str, Any]], jobs: int, on_start: Callable[[dict], None], on_done: OnDone) -> None:
    threads = max(1, (os.cpu_count() or 1) // jobs)

    def one(cell: dict[str, Any]) -> None:
        on_start(cell)
        on_done(cell, execute(cell, threads))

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="matrix-cell")
    try:
        for f in [pool.submit(one, c) for c in cells]:
            f.result()
    except BaseException:  # Ctrl-C / SIGTERM: no new cell starts, the running ones are stopped (they unwind)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(_running):
            proc.terminate()
        raise
    pool.shutdown()


def run_ray(cells: list[dict[str, Any]], address: str, on_start: Callable[[dict], None], on_done: OnDone) -> None:
    """Each cell a Ray task (one CPU) on the cluster at ``address`` (``auto``: the one this machine belongs to or
    RAY_ADDRESS). Ray is imported only here. A driver that already called ``ray.init`` keeps its connection."""
    from edgekit.deps import require

    ray = require("ray", "ray")
    if not ray.is_initialized():
        import logging
        import socket

        if address != "auto":  # Ray itself retries an address where nothing listens for minutes: ask first
            host, _, port = address.removeprefix("ray://").rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=10).close()
            except (OSError, ValueError) as exc:
                raise MatrixSpecError(f"--ray {address}: no Ray cluster answers there ({exc}); give the head node's "
                                      "host:port (`ray status` on it), or `auto`") from None
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except ConnectionError as exc:
            raise MatrixSpecError(f"--ray {address}: no Ray cluster there ({_one_line(exc, 160)}); start one "
                                  "(`ray start --head`) or give its address (host:port)") from None
    task = ray.remote(num_cpus=1, max_retries=0)(execute)
    pending = {}
    for c in cells:
        pending[task.remote(c)] = c
        on_start(c)
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                cell = pending.pop(ref)
                try:
                    res = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a lost node or worker is this cell's error, not the run's
                    res = {"status": "error", "error": type(exc).__name__,
                           "reason": _one_line(f"Ray task failed: {exc}"), "seconds": 0.0}
                on_done(cell, res)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def run(spec_path: str | Path, out: str | Path, jobs: int | None = None, ray: str | None = None,
        cache: bool = True, cache_dir: str | Path | None = None,
        on_start: Callable[[dict], None] = lambda c: None, on_done: OnDone = lambda c, r: None) -> dict[str, Any]:
    """Run every cell of the spec; write ``matrix.json`` and ``matrix.html`` into ``out`` and one ``matrix`` event
    per cell into the results store. Returns the matrix (its ``cells`` carry their results). Every cell uses the
    build cache at ``cache_dir`` (resolved here, so Ray workers on other nodes use the same, shared, folder)."""
    from edgekit import __version__, results
    from edgekit.cache import cache_root
    from edgekit.fsutil import atomic_write_bytes

    spec = load_spec(spec_path)
    out = Path(out)
    cells = plan_cells(spec, spec_path, out)
    db, folder = str(results.db_path()), str(cache_root(cache_dir).resolve())
    for c in cells:
        c["results_db"] = db
        c["convert"].update(cache=cache, cache_dir=folder)
    todo = [c for c in cells if "result" not in c]
    for c in cells:
        if "result" in c:
            on_done(c, c["result"])
    t0 = time.perf_counter()

    def done(cell: dict[str, Any], res: dict[str, Any]) -> None:
        cell["result"] = res
        on_done(cell, res)

    if ray:
        run_ray(todo, ray, on_start, done)
    elif todo:
        run_pool(todo, jobs or default_jobs(), on_start, done)
    matrix = {
        "edgekit_matrix": 1, "spec": str(Path(spec_path).resolve()), "edgekit": __version__,
        "runner": f"ray {ray}" if ray else f"process pool, {jobs or default_jobs()} jobs",
        "wall_s": round(time.perf_counter() - t0, 2),
        "cells": [{k: c[k] for k in ("id", "model", "board", "board_id", "target", "precision", "out", "log")}
                  | c["result"] for c in cells],
    }
    matrix["totals"] = {s: sum(c["status"] == s for c in matrix["cells"]) for s in STATUSES}
    from edgekit.matrix_html import render

    atomic_write_bytes(out / "matrix.json", json.dumps(matrix, indent=1, default=str).encode())
    atomic_write_bytes(out / "matrix.html", render(matrix).encode())
    try:
        for c in matrix["cells"]:
            verdict = {"pass": True, "failed": False, "error": False}.get(c["status"])  # refused / skipped: none
            results.record("matrix", board_id=c["board_id"], precision=c["precision"], passed=verdict, bundle=c["id"],
                           matrix=matrix["spec"], **{k: v for k, v in c.items() if k not in ("id", "board_id", "precision")})
    except Exception as exc:  # noqa: BLE001 - a locked or full store must not lose the finished matrix (written above)
        matrix["warnings"] = [f"results store not updated: {_one_line(exc)}"]
    return matrix


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
