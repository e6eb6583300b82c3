"""The CLI: fast help without heavy imports, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "onnx", "onnxruntime", "tensorflow", "coremltools", "hls4ml", "onnxslim", "ai_edge_litert")


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=timeout)


def test_help_and_boards_import_no_framework():
    code = (
        "import sys\n"
        "from edgekit.cli import app\n"
        "for argv in (['--help'], ['boards'], ['boards', 'show', 'jetson-orin-nano-8gb'], ['targets']):\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, (argv, e.code)\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_user_errors_are_one_line_exit_2(tmp_path):
    bad = tmp_path / "cut.pt2"
    bad.write_bytes(b"PK\x03\x04 not really")
    for args, needle in [
        (["convert", "nope.pt2"], "no such file"),
        (["convert", str(bad)], "cut.pt2"),
        (["convert", "examples/digits/digits_cnn.pt2", "--target", "toaster"], "known targets"),
        (["convert", "examples/digits/digits_cnn.pt2", "--board", "jetson-tx9"], "known boards"),
        (["boards", "show", "jetson-orin-nano-8gb", "--set", "ram_mb=-5"], "ram_mb"),
        (["convert", "examples/digits/digits_cnn.pt2", "--tolerance", "min_top1_agreemnt=0.99"], "min_top1_agreemnt"),
        (["convert", "examples/digits/digits_cnn.pt2", "--tolerance", "min_top1_agreement=1.5"], "min_top1_agreement"),
    ]:
        proc = _run(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert needle in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr  # one message (rich may wrap it)


def test_inspect_json_and_table(digits):
    proc = _run("inspect", str(digits["model"]), "--json", "--target", "jetson")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["macs"] > 0 and data["peak_activation_bytes"] > 0 and data["unsupported"] == []
    assert set(data["weight_bytes"]) == {"fp32", "fp16", "int8", "int4"}
    assert data["model"]["inputs"][0]["shape"] == [1, 1, 8, 8]
    table = _run("inspect", str(digits["model"]))
    assert table.returncode == 0 and "peak live activations" in table.stdout and "Conv" in table.stdout


def test_convert_cli_quickstart(digits, tmp_path):
    out = tmp_path / "jetson"
    proc = _run("convert", str(digits["model"]), "--target", "jetson", "-p", "int8", "--calib", str(digits["calib"]),
                "--eval", str(digits["eval"]), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.onnx").exists() and (out / "manifest.json").exists()
    assert "accuracy (450 samples)" in proc.stdout


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_convert_tolerance_flag_sets_the_bar(digits, tmp_path):
    """--tolerance replaces the target's bar for the build (recorded in the manifest): one that LiteRT's float
    kernels cannot meet against torch (summation order) fails verification, non-zero exit, naming the error."""
    ok = _run("convert", str(digits["model"]), "--target", "jetson", "-p", "fp32", "--tolerance", "max_rel_error=2e-4",
              "-o", str(tmp_path / "a"), "--no-cache")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["tolerance"]["max_rel_error"] == 2e-4
    bad = _run("convert", str(digits["model"]), "--target", "android", "-p", "fp32", "--tolerance",
               "max_rel_error=1e-12", "--tolerance", "abs_floor=1e-12", "--tolerance", "max_error_decides=true",
               "-o", str(tmp_path / "b"), "--no-cache")
    assert bad.returncode != 0 and "max error" in bad.stdout + bad.stderr, (bad.stdout, bad.stderr)


def test_tables_fit_80_columns(tmp_path):
    """`edgekit boards` and `edgekit results` at 80 columns: every column keeps its header, no line is wider."""
    import os

    env = {**os.environ, "COLUMNS": "80", "EDGEKIT_RESULTS_DB": str(tmp_path / "r.sqlite")}
    from edgekit import results

    results.use_db(tmp_path / "r.sqlite")
    try:
        results.record("convert", board_id="nvidia/jetson-orin-nano-8gb", precision="int8", bundle="digits_cnn-jetson-int8",
                       model_sha256="ab" * 32, estimated_latency_ms=0.4, passed=True)
    finally:
        results.use_db(None)
    for args, headers in ((["boards"], ("board", "targets", "RAM", "precisions", "power")),
                          (["results"], ("id", "kind", "board", "precision", "est. ms", "meas. ms", "result"))):
        proc = subprocess.run([sys.executable, "-m", "edgekit", *args], capture_output=True, text=True, timeout=60,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert max(len(ln) for ln in lines) <= 80 and "┃┃" not in proc.stdout and "…" not in proc.stdout
        for h in headers:
            assert h in proc.stdout, (args, h)


def test_version_flag_and_targets_show_the_extras():
    """`edgekit --version` prints the version; `edgekit targets` shows each extra as `edgekit[android]` (rich would
    eat the brackets as markup)."""
    from edgekit import __version__

    proc = _run("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == __version__
    proc = _run("targets")
    assert proc.returncode == 0
    for extra in ("edgekit[jetson]", "edgekit[android]", "edgekit[ios]", "edgekit[fpga]"):
        assert extra in proc.stdout.replace("\n", ""), proc.stdout


def test_an_op_refusal_comes_before_asking_for_calibration(tmp_path):
    """The FPGA target refuses GELU's Erf (hls4ml has no such layer): that is said, not "give --calib" first."""
    import torch

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).eval()
    path = tmp_path / "hs.pt2"
    torch.export.save(torch.export.export(model, (torch.zeros(1, 1, 8, 8),)), str(path))
    proc = _run("convert", str(path), "--target", "fpga", "-p", "int8", "-o", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    assert "hls4ml has no Erf" in proc.stderr and "--calib" not in proc.stderr, proc.stderr
