"""The build cache (edgekit.cache): hits, misses, --no-cache, prune, and the safety of the output folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgekit import cache, results
from edgekit.errors import OutputError
from edgekit.fsutil import sha256_file
from edgekit.pipeline import convert
from edgekit.profiles import load_board, load_target

ML = ("torch", "tensorflow", "onnx", "onnxruntime", "coremltools")


@pytest.fixture(scope="module")
def first(digits, tmp_path_factory):
    """One cold fp32 build of the digits model into a cache of this module's own."""
    root = tmp_path_factory.mktemp("cache")
    logs: list[str] = []
    kw = dict(precision="fp32", calib=str(digits["calib"]), eval_data=str(digits["eval"]), cache_dir=root / "cache")
    res = convert(digits["model"], "jetson", root / "a", log=logs.append, **kw)
    return {"root": root, "kw": kw, "res": res, "logs": logs}


def test_cold_build_is_stored_and_an_identical_convert_is_a_hit(first, digits):
    cold = first["res"]
    assert cold.cache == {"hit": False, "key": cold.cache["key"], "built_utc": cold.manifest["created_utc"]}
    assert not any("from the build cache" in m for m in first["logs"])  # nothing was cached before
    out = first["root"] / "b"
    warm = convert(digits["model"], "jetson", out, **first["kw"])
    assert warm.cache["hit"] and warm.cache["key"] == cold.cache["key"]
    assert warm.manifest == cold.manifest  # the verified build as it was written, not a new one
    assert warm.verification.passed and warm.verification.to_json() == cold.verification.to_json()
    for rel, info in cold.manifest["files"].items():
        assert sha256_file(out / rel) == info["sha256"]
    assert json.loads((out / "manifest.json").read_text()) == cold.manifest
    ev = results.events("convert", limit=1)[0]  # the run is recorded, marked as a hit
    assert ev["cache_hit"] is True and ev["out"] == str(out.resolve())


def test_warm_cli_convert_imports_no_ml_framework(first, digits, tmp_path):
    out = tmp_path / "c"
    args = ["convert", str(digits["model"]), "--target", "jetson", "-p", "fp32", "--calib", str(digits["calib"]),
            "--eval", str(digits["eval"]), "-o", str(out), "--cache-dir", str(first["kw"]["cache_dir"])]
    code = ("import sys\nfrom edgekit.cli import main\nsys.argv = ['edgekit', *sys.argv[1:]]\n"
            "try:\n    main()\nfinally:\n"
            f"    print('LOADED', [m for m in {ML!r} if m in sys.modules], file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert f"cache hit {first['res'].cache['key'][:12]}" in proc.stderr
    assert "LOADED []" in proc.stderr, proc.stderr
    assert (out / "model.onnx").is_file()


def test_changed_calibration_file_is_a_miss_and_the_float_analysis_is_reused(first, digits, tmp_path):
    calib = tmp_path / "calib.npz"
    data = dict(np.load(digits["calib"]))
    data["image"] = data["image"][:150]  # other bytes: another build
    np.savez(calib, **data)
    logs: list[str] = []
    res = convert(digits["model"], "jetson", tmp_path / "o", **{**first["kw"], "calib": str(calib)}, log=logs.append)
    assert res.cache["hit"] is False and res.cache["key"] != first["res"].cache["key"]
    assert any("analysis: from the build cache" in m for m in logs), logs  # same model, same target
    assert res.verification.passed


def test_changed_board_override_is_another_key(first, digits):
    def key(board_set):
        tgt = load_target("jetson")
        brd = load_board("nvidia/jetson-orin-nano-8gb", board_set)
        kw = {k: v for k, v in first["kw"].items() if k not in ("precision", "cache_dir")}
        return cache.open_cache(str(digits["model"]), tgt, brd, "fp32", input_shape=None, consts=None,
                                trust_pickle=False, opset=None, golden_count=64, options=None, output_kinds=None,
                                eval_output=None, cache_dir=first["kw"]["cache_dir"], eval_data=kw["eval_data"],
                                calib=kw["calib"])

    same, other = key(None), key(["budgets.latency_ms=3"])
    assert same.key == first["res"].cache["key"]  # the key is a pure function of the inputs
    assert other.key != same.key and other.analysis_key == same.analysis_key  # the board is not in the analysis
    assert other.restore(None, lambda m: Path("unused"), print) is None


def test_no_cache_rebuilds(first, digits, tmp_path):
    res = convert(digits["model"], "jetson", tmp_path / "o", **{**first["kw"], "cache": False})
    assert res.cache is None
    assert res.manifest["created_utc"] >= first["res"].manifest["created_utc"]
    assert set(res.timings_s) >= {"ingest", "analyze", "convert", "verify"}  # every stage ran again
    assert res.verification.passed


def test_a_hit_never_overwrites_a_foreign_folder(first, digits, tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("my notes")
    with pytest.raises(OutputError, match="not an edgekit output"):
        convert(digits["model"], "jetson", dest, **first["kw"])
    assert [p.name for p in dest.iterdir()] == ["notes.txt"] and (dest / "notes.txt").read_text() == "my notes"


def test_a_hit_still_checks_every_option(first, digits, tmp_path):
    """A bad --max-data-mb is refused before the cache is asked (it used to be read only when the data loaded, so a
    cache hit accepted NaN: the hostile corpus met it when another case had stored the same build)."""
    from edgekit.errors import InputSpecError

    for bad in (float("nan"), -1.0):
        with pytest.raises(InputSpecError, match="--max-data-mb"):
            convert(digits["model"], "jetson", tmp_path / "o", **first["kw"], max_data_mb=bad)
    assert not (tmp_path / "o").exists()


def test_an_entry_changed_after_it_was_stored_is_dropped(first, tmp_path):
    import shutil

    root = tmp_path / "cache"
    shutil.copytree(first["kw"]["cache_dir"], root)
    entry = root / "builds" / first["res"].cache["key"]
    (entry / "build" / "golden.npz").write_bytes(b"edited in place through a hard-linked output")
    bc = cache.BuildCache(root, first["res"].cache["key"], "", {})
    logs: list[str] = []
    assert bc.restore(tmp_path / "o", lambda m: Path("unused"), logs.append) is None
    assert not entry.exists() and "no longer matches" in logs[0]
    assert not (tmp_path / "o").exists()


def test_ls_and_prune_least_recently_used_first(first, tmp_path):
    import shutil

    from typer.testing import CliRunner

    from edgekit.cli import app

    root = tmp_path / "cache"
    shutil.copytree(first["kw"]["cache_dir"], root)
    found = cache.entries(root)
    assert {e.kind for e in found} == {"build", "analysis"} and all(e.bytes > 0 for e in found)
    newest = found[-1]
    os.utime(newest.path / cache.ENTRY, (2e9, 2e9))  # used last
    ls = CliRunner().invoke(app, ["cache", "ls", "--cache-dir", str(root)], env={"COLUMNS": "200"})
    assert ls.exit_code == 0 and newest.key[:12] in ls.output and "jetson" in ls.output
    keep_gb = newest.bytes / 1e9
    out = CliRunner().invoke(app, ["cache", "prune", "--max-gb", str(keep_gb), "--cache-dir", str(root)])
    assert out.exit_code == 0, out.output
    assert [e.key for e in cache.entries(root)] == [newest.key]
    cache.prune(0, root)
    assert cache.entries(root) == []


def test_a_factory_model_is_not_cached_and_says_so_once(tmp_path):
    logs: list[str] = []
    tgt = load_target("jetson")
    for _ in range(2):
        assert cache.open_cache("plan_nets:tiny", tgt, load_board("nvidia/jetson-orin-nano-8gb"), "fp32",
                                calib=None, eval_data=None, input_shape=None, consts=None, trust_pickle=False,
                                opset=None, golden_count=64, options=None, output_kinds=None, eval_output=None,
                                log=logs.append) is None
    assert len([m for m in logs if "factory" in m]) <= 1  # once per process (an earlier test may have said it)
