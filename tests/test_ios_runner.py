"""The iOS bundle's files: firmware/coreml/run.py (macOS smoke runner) and the XCTest's golden reader."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("coremltools", reason="the ios extra is not installed: pip install 'edgekit[ios]'")

from edgekit.pipeline import convert  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKS = ["integrity", "load", "golden", "latency", "memory", "power"]
RESULT_KEYS = {"bundle", "board", "precision", "host", "machine", "python", "checks", "started_utc", "runtime",
               "latency_ms", "peak_rss_mb", "power_w", "passed", "finished_utc"}


@pytest.fixture(scope="module")
def bundle(digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("iosb") / "b"
    convert(digits["model"], target="ios", out=out, precision="int8-weight", calib=str(digits["calib"]))
    return out


def _runner(bundle: Path):
    spec = importlib.util.spec_from_file_location("ios_bundle_run", bundle / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class MILRuntime:
    """Not a fake: the package's own MIL program run in torch, standing in for Core ML off macOS."""

    def __init__(self, bundle, manifest, compute_units):
        from edgekit.converters.coreml.interpreter import MILInterpreter
        from edgekit.converters.coreml.mil import load_program

        self.interp = MILInterpreter(load_program(Path(bundle) / manifest["artifact"]["primary"], decompress=True))
        self.name = "edgekit MIL interpreter (torch) on %s" % compute_units

    def __call__(self, feeds):
        return self.interp(feeds)


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS run.py loads Core ML for real")
def test_run_py_off_macos_fails_load_and_says_why(bundle, tmp_path):
    out = tmp_path / "smoke.json"
    rc = _runner(bundle).main(["--bundle", str(bundle), "--output", str(out)])
    res = json.loads(out.read_text())
    assert rc == 1 and res["passed"] is False
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["integrity"]["passed"] is True
    assert checks["load"]["passed"] is False and "only on macOS" in checks["load"]["detail"]


def test_run_py_with_the_package_program(bundle, tmp_path):
    out = tmp_path / "smoke.json"
    rc = _runner(bundle).main(["--bundle", str(bundle), "--output", str(out), "--iters", "20", "--warmup", "2"],
                              load=MILRuntime)
    res = json.loads(out.read_text())
    assert rc == 0, res
    assert set(res) == RESULT_KEYS  # same schema as firmware/tensorrt/run.py
    assert [c["name"] for c in res["checks"]] == CHECKS
    golden = res["checks"][2]
    assert golden["passed"] and golden["outputs"][0]["top1_agreement"] >= 0.95
    assert 0 < res["latency_ms"]["p50"] <= res["latency_ms"]["p90"] <= res["latency_ms"]["p99"]


def test_run_py_off_device_latency_is_reported_never_judged(bundle, tmp_path):
    """run.py never runs on the phone: a host's latency must not pass or fail the device's budget."""
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    man = json.loads((copy / "manifest.json").read_text())  # manifest.json itself is not in its file list
    assert man["budgets"]["latency_ms"] > 0
    man["budgets"]["latency_ms"] = 1e-6  # a budget no host can meet: judging it would fail the run
    (copy / "manifest.json").write_text(json.dumps(man))
    out = tmp_path / "smoke.json"
    rc = _runner(copy).main(["--bundle", str(copy), "--output", str(out), "--iters", "5", "--warmup", "1"],
                            load=MILRuntime)
    res = json.loads(out.read_text())
    lat = {c["name"]: c for c in res["checks"]}["latency"]
    assert rc == 0 and res["passed"] is True, res
    assert lat["passed"] is None and "budget_ms" not in lat
    assert "measured on this host, not the device" in lat["detail"]
    assert res["latency_ms"]["p50"] > 0 and res["latency_ms"]["on_device"] is False


def test_off_device_latency_does_not_reach_the_results_store():
    from edgekit.smoke import SmokeResult

    lat = {"p50": 1.5, "p90": 2.0, "p99": 2.5}
    on = SmokeResult("d", 0, {"passed": True, "latency_ms": {**lat, "on_device": True}}, 1.0, {})
    off = SmokeResult("d", 0, {"passed": True, "latency_ms": {**lat, "on_device": False}}, 1.0, {})
    older = SmokeResult("d", 0, {"passed": True, "latency_ms": lat}, 1.0, {})  # runners before the flag
    assert on.latency_p50_ms == older.latency_p50_ms == 1.5 and off.latency_p50_ms is None


def test_run_py_detects_a_changed_file(bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    wbin = copy / "model.mlpackage" / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    raw = bytearray(wbin.read_bytes())
    raw[-1] ^= 0xFF
    wbin.write_bytes(bytes(raw))
    rc = _runner(copy).main(["--bundle", str(copy)], load=MILRuntime)
    res = json.loads((copy / "smoke_result.json").read_text())
    assert rc == 1 and res["checks"][0]["name"] == "integrity" and res["checks"][0]["passed"] is False
    assert "weight.bin: sha256 differs" in res["checks"][0]["detail"]


def test_run_py_unusable_bundle_exits_2(tmp_path):
    shutil_src = ROOT / "firmware" / "coreml" / "run.py"
    (tmp_path / "run.py").write_bytes(shutil_src.read_bytes())
    assert _runner(tmp_path).main(["--bundle", str(tmp_path)]) == 2


def test_golden_npz_layout_fits_the_swift_reader(bundle):
    """EdgekitModelTests.swift walks local zip headers and reads .npy entries stored uncompressed: check that holds."""
    data = (bundle / "golden.npz").read_bytes()
    found, i = {}, 0
    while data[i:i + 4] == b"PK\x03\x04":  # the Swift reader's loop, step by step
        method, = struct.unpack_from("<H", data, i + 8)
        name_len, extra_len = struct.unpack_from("<HH", data, i + 26)
        name = data[i + 30:i + 30 + name_len].decode()
        start = i + 30 + name_len + extra_len
        assert method == 0, f"{name} is compressed: the Swift reader needs numpy.savez (stored)"
        assert data[start:start + 6] == b"\x93NUMPY"
        header_len, = struct.unpack_from("<H", data, start + 8)
        header = eval(data[start + 10:start + 10 + header_len].decode())  # noqa: S307 - numpy's own dict literal
        n = int(np.prod(header["shape"])) * np.dtype(header["descr"]).itemsize
        found[name[:-4]] = np.frombuffer(data, header["descr"], int(np.prod(header["shape"])),
                                         start + 10 + header_len).reshape(header["shape"])
        i = start + 10 + header_len + n
    ref = np.load(bundle / "golden.npz")
    assert sorted(found) == sorted(ref.files) == ["input_0", "output_0"]
    for k in ref.files:
        np.testing.assert_array_equal(found[k], ref[k])


def test_bundle_ships_the_xctest_and_readme(bundle):
    swift = (bundle / "EdgekitModelTests.swift").read_text()
    assert 'resource("model", "mlmodelc")' in swift and 'resource("golden", "npz")' in swift
    assert "max_rel_error" in swift and "min_top1_agreement" in swift and "latency_ms" in swift
    assert 'manifest["carry"]' in swift and "carried[pair[\"input\"]!] = m" in swift  # a carried state fed back
    readme = (bundle / "README.md").read_text()
    assert "Copy items if needed" in readme and "xcodebuild test" in readme
