"""`edgekit matrix`: real converts of two small trained models (the digits CNN, the digits MLP) for two boards at
jetson fp32 (the fastest target), through the process pool and through a local Ray cluster; the same table both
ways. The spec also holds the cells that must not pass: a board that does not take the target (skipped), a cell
whose tolerance override cannot be met (failed verification); a second spec holds a truncated model file
(refused), a factory that raises (error, traceback only in the log) and one whose process dies (error)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgekit import matrix as mx
from edgekit import results
from edgekit.cli import app
from edgekit.errors import EdgekitError, MatrixSpecError

ROOT = Path(__file__).resolve().parents[1]
SPEC = """
precisions = ["fp32"]
target = "jetson"
boards = ["host", {{ board = "nvidia/jetson-orin-nano-8gb", name = "orin" }}, "apple/iphone-15-pro"]

[[models]]
name = "cnn"
path = "{root}/examples/digits/digits_cnn.pt2"
calib = "{root}/examples/digits/calib.npz"
eval = "{root}/examples/digits/eval.npz"
golden = 16

[[models]]
name = "mlp"
path = "{root}/examples/digits_fpga/digits_mlp.pt2"
calib = "{root}/examples/digits/calib.npz"
golden = 16

[[cells]]   # a tolerance no fp32 build meets: this one cell fails verification
model = "mlp"
board = "orin"
tolerance = {{ max_rel_error = 1e-12, abs_floor = 0.0, max_error_decides = true }}
"""
EXPECTED = {  # (model, board) -> status
    ("cnn", "host"): "pass", ("cnn", "orin"): "pass", ("mlp", "host"): "pass", ("mlp", "orin"): "failed",
    ("cnn", "iphone-15-pro"): "skipped", ("mlp", "iphone-15-pro"): "skipped",
}


def _spec(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "matrix.toml"
    path.write_text(SPEC.format(root=ROOT))
    return path


def _table(m: dict) -> dict:
    """What the user compares between two runs: per cell its status, reason (paths aside), size, estimate, accuracy."""
    def clean(r):
        return re.sub(r"/\S+", "PATH", r) if r else r
    return {c["id"]: (c["status"], clean(c.get("reason")), c.get("artifact_bytes"), c.get("estimated_latency_ms"),
                      c.get("accuracy_drop_points"), c.get("top1_agreement")) for c in m["cells"]}


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("matrix-pool")
    spec = _spec(d)
    res = CliRunner().invoke(app, ["matrix", str(spec), "-o", str(d / "out"), "-j", "2", "--cache-dir", str(d / "cache")])
    return d, res


def test_pool_runs_every_cell_and_reports_each_outcome(pool_run):
    d, res = pool_run
    assert res.exit_code == 1, res.output  # one cell failed verification
    assert "Traceback" not in res.output
    m = json.loads((d / "out" / "matrix.json").read_text())
    assert {(c["model"], c["board"]): c["status"] for c in m["cells"]} == EXPECTED
    assert m["totals"] == {"pass": 3, "failed": 1, "refused": 0, "error": 0, "skipped": 2}
    by = {c["id"]: c for c in m["cells"]}
    cnn = by["cnn-host-fp32"]
    assert cnn["accuracy_drop_points"] == pytest.approx(0, abs=0.5) and cnn["float_accuracy"] > 0.9
    assert cnn["artifact_bytes"] > 10_000 and cnn["estimated_latency_ms"] > 0
    assert (Path(cnn["out"]) / "manifest.json").is_file()
    assert by["mlp-host-fp32"]["top1_agreement"] == 1.0 and by["mlp-host-fp32"]["accuracy_drop_points"] is None
    # the override reached the build: its manifest carries the tolerance, its reason names the output
    failed = by["mlp-orin-fp32"]
    assert failed["reason"].startswith("output 'output': max error"), failed["reason"]
    assert json.loads((Path(failed["out"]) / "manifest.json").read_text())["tolerance"]["max_rel_error"] == 1e-12
    assert "does not take target 'jetson'" in by["cnn-iphone-15-pro-fp32"]["reason"]
    # the summary table and the one-line reasons are on the screen
    for cid in by:
        assert cid in res.output
    # one matrix event per cell in the results store, next to the convert events the workers recorded
    ev = results.events("matrix")
    assert {e["bundle"] for e in ev} >= set(by) and all(isinstance(e["id"], int) for e in ev)
    assert {e["bundle"]: e["passed"] for e in ev if e["bundle"] in by} == {
        "cnn-host-fp32": True, "cnn-orin-fp32": True, "mlp-host-fp32": True, "mlp-orin-fp32": False,
        "cnn-iphone-15-pro-fp32": None, "mlp-iphone-15-pro-fp32": None}
    assert any(e["kind"] == "convert" and e["out"] == cnn["out"] for e in results.events("convert"))


def test_rerun_rebuilds_only_what_changed(pool_run):
    """The same spec again with one board override added for one cell: the unchanged verified cells come from the
    build cache (no ML framework loaded), the changed one is rebuilt, the failed one is rebuilt (a build that failed
    verification is never cached)."""
    d, _ = pool_run
    spec = d / "changed.toml"
    spec.write_text((d / "matrix.toml").read_text()
                    + '[[cells]]\nmodel = "cnn"\nboard = "orin"\nset = ["budgets.latency_ms=5"]\n')
    res = CliRunner().invoke(app, ["matrix", str(spec), "-o", str(d / "rerun"), "-j", "2", "--cache-dir", str(d / "cache")])
    assert res.exit_code == 1, res.output
    m = json.loads((d / "rerun" / "matrix.json").read_text())
    assert {(c["model"], c["board"]): c["status"] for c in m["cells"]} == EXPECTED
    hits = {c["id"]: c.get("cache_hit") for c in m["cells"] if c["status"] in ("pass", "failed")}
    assert hits == {"cnn-host-fp32": True, "mlp-host-fp32": True, "cnn-orin-fp32": False, "mlp-orin-fp32": False}
    assert "(2 from the build cache)" in res.output
    by = {c["id"]: c for c in m["cells"]}
    assert json.loads((Path(by["cnn-orin-fp32"]["out"]) / "manifest.json").read_text())["budgets"]["latency_ms"] == 5


def test_html_is_self_contained_and_names_the_failures(pool_run):
    d, _ = pool_run
    html = (d / "out" / "matrix.html").read_text()
    assert "<script" not in html and "http" not in html and "<link" not in html
    for heading in ("Status", "Accuracy drop", "Size", "Estimated latency", "Cells that did not pass (3)"):
        assert heading in html
    assert "mlp-orin-fp32" in html and "cnn-iphone-15-pro-fp32" in html and "hsl(" in html


def test_refusals_errors_and_crashes_stay_in_their_cell(tmp_path):
    (tmp_path / "nets.py").write_text(
        "import os, signal\n"
        "def boom():\n    raise RuntimeError('boom from the factory')\n"
        "def die():\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    spec = tmp_path / "m.toml"
    spec.write_text('precisions = ["fp32"]\nboards = ["host"]\ntarget = "jetson"\n'
                    '[[models]]\nname = "boom"\npath = "nets:boom"\ninput_shape = ["1,64"]\n'
                    '[[models]]\nname = "die"\npath = "nets:die"\ninput_shape = ["1,64"]\n'
                    '[[models]]\nname = "broken"\npath = "broken.pt2"\n')
    (tmp_path / "broken.pt2").write_bytes((ROOT / "examples/digits/digits_cnn.pt2").read_bytes()[:3000])
    res = CliRunner().invoke(app, ["matrix", str(spec), "-o", str(tmp_path / "out"), "-j", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    by = {c["model"]: c for c in json.loads((tmp_path / "out" / "matrix.json").read_text())["cells"]}
    assert by["boom"]["status"] == "error" and by["boom"]["reason"] == "RuntimeError: boom from the factory"
    assert "Traceback" in Path(by["boom"]["log"]).read_text()
    assert by["die"]["status"] == "error" and "killed by signal 9" in by["die"]["reason"]
    assert by["broken"]["status"] == "refused" and "broken.pt2: not a torch archive" in by["broken"]["reason"]


def test_stopping_the_run_stops_its_cells_and_starts_no_more(tmp_path):
    """SIGTERM to `edgekit matrix` (as Ctrl-C or a job scheduler sends): the running cell's process is ended, no
    queued cell starts, the driver exits 143."""
    import signal
    import time

    (tmp_path / "nets.py").write_text(
        "import os, time\n"
        f"def slow():\n    open({str(tmp_path / 'pid')!r}, 'w').write(str(os.getpid()))\n    time.sleep(120)\n")
    spec = tmp_path / "m.toml"
    spec.write_text('precisions = ["fp32"]\nboards = ["host"]\ntarget = "jetson"\n' + "".join(
        f'[[models]]\nname = "m{i}"\npath = "nets:slow"\ninput_shape = ["1,64"]\n' for i in range(3)))
    proc = subprocess.Popen([sys.executable, "-m", "edgekit", "matrix", str(spec), "-o", str(tmp_path / "out"),
                             "-j", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "pid").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(0.5)
    child = int((tmp_path / "pid").read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    for _ in range(50):  # the cell's process is gone (or a zombie about to be reaped)
        try:
            gone = Path(f"/proc/{child}/status").read_text().split("State:")[1].split()[0] == "Z"
        except (FileNotFoundError, IndexError):
            gone = True
        if gone:
            break
        time.sleep(0.2)
    assert gone, f"cell process {child} still running"
    assert sorted(p.name for p in (tmp_path / "out" / "logs").iterdir()) == ["m0-host-fp32.log"]
    assert not (tmp_path / "out" / "matrix.json").exists()


@pytest.mark.parametrize("text, msg", [
    ('precisions = ["fp32"]\nboards = ["host"]\n[[models]]\nname = "a"\npath = "a.pt2"\ncalibb = "x"\n',
     "models.0.calibb: not a matrix spec field"),
    ('precisions = ["fp32"]\nboards = ["host"]\nmodels = []\n', "models: List should have at least 1 item"),
    ('precisions = ["fp32"]\nboards = ["host", "host"]\n[[models]]\nname = "a"\npath = "a.pt2"\n',
     "boards: host given twice"),
    ('precisions = ["fp32"]\nboards = ["host"]\n[[models]]\nname = "a"\npath = "a.pt2"\n[[cells]]\nboard = "orin"\n',
     "cells.0.board: 'orin' is none of the spec's boards"),
    ('precisions = ["fp32"\n', "not valid TOML"),
])
def test_bad_spec_is_one_line_naming_the_field(tmp_path, text, msg):
    spec = tmp_path / "m.toml"
    spec.write_text(text)
    with pytest.raises(MatrixSpecError, match=re.escape(msg)):
        mx.load_spec(spec)


@pytest.mark.parametrize("extra, msg", [
    ('set = ["ram_mb=-1"]\n', "ram_mb: Input should be greater than 0"),
    ('tolerance = { max_rel_error = -1 }\n', "max_rel_error: Input should be greater than 0"),
    ('options = { no_such_option = 1 }\n', "no_such_option"),
])
def test_bad_override_is_refused_before_any_cell(tmp_path, extra, msg):
    spec = tmp_path / "m.toml"
    spec.write_text('precisions = ["fp32"]\nboards = ["host"]\n[[models]]\nname = "a"\npath = "a.pt2"\n'
                    '[[cells]]\nmodel = "a"\n' + extra)
    with pytest.raises(EdgekitError, match=re.escape(msg)):
        mx.plan_cells(mx.load_spec(spec), spec, tmp_path / "out")


def test_cli_refuses_a_bad_spec_in_one_line_before_any_cell(tmp_path):
    spec = tmp_path / "m.toml"
    spec.write_text('precisions = ["fp32"]\nboards = ["no-such-board"]\n[[models]]\nname = "a"\npath = "a.pt2"\n')
    proc = subprocess.run([sys.executable, "-m", "edgekit", "matrix", str(spec), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown board 'no-such-board'" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- Ray: the same spec, the same table


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster of two CPUs for this module. HOME is pytest's: Ray 2.60 writes the cluster's
    authentication token to ~/.ray/auth_token (and the driver the test starts reads it there)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'edgekit[ray]')")
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(tmp_path_factory.mktemp("ray-home")))
    # Ray's sockets live under its temp folder and an AF_UNIX path holds at most 107 bytes: pytest's folder (one
    # per xdist worker) is too deep, so the cluster gets a short folder of its own, removed afterwards
    import shutil
    import tempfile

    short = tempfile.mkdtemp(prefix="ekray-", dir="/tmp")
    mp.setenv("TMPDIR", short)  # the driver process the test starts makes its Ray folder there too
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=short)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    mp.undo()
    shutil.rmtree(short, ignore_errors=True)


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_ray_gives_the_same_table_as_the_pool(pool_run, ray_cluster, tmp_path):
    d, _ = pool_run
    spec = _spec(tmp_path)
    # a separate driver process connects to the cluster by its address, as a user's `--ray HOST:PORT` does
    # its own cache folder: every Ray cell builds (none is a copy of a pool build), and the workers fill that folder
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "edgekit", "matrix", str(spec), "-o", str(tmp_path / "out"),
                           "--ray", ray_cluster, "--cache-dir", str(cache)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    pool = json.loads((d / "out" / "matrix.json").read_text())
    ray = json.loads((tmp_path / "out" / "matrix.json").read_text())
    assert ray["runner"] == f"ray {ray_cluster}"
    assert _table(ray) == _table(pool)
    assert not any(c.get("cache_hit") for c in ray["cells"])
    assert len(list((cache / "builds").iterdir())) == 3  # the three verified builds, stored by the Ray workers


def test_ray_address_where_nothing_listens_is_one_line(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    import socket

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # this process may hold the module's test cluster

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        spec = tmp_path / "m.toml"
        spec.write_text('precisions = ["fp32"]\nboards = ["host"]\n[[models]]\nname = "a"\npath = "a.pt2"\n')
        with pytest.raises(MatrixSpecError, match="no Ray cluster answers there"):
            mx.run(spec, tmp_path / "out", ray=f"127.0.0.1:{s.getsockname()[1]}")


def test_ray_missing_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: `import ray` raises ImportError
    spec = tmp_path / "m.toml"
    spec.write_text('precisions = ["fp32"]\nboards = ["host"]\n[[models]]\nname = "a"\npath = "a.pt2"\n')
    from edgekit.errors import MissingToolchainError

    with pytest.raises(MissingToolchainError, match=re.escape("pip install 'edgekit[ray]'")):
        mx.run(spec, tmp_path / "out", ray="auto")
