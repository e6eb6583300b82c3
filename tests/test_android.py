"""Android / LiteRT path on the digits example: real litert-torch conversion, real LiteRT
interpreter (ai-edge-litert, XNNPACK), the bundle's run.py on the host."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

from edgekit.errors import InputSpecError  # noqa: E402
from edgekit.pipeline import convert  # noqa: E402
from edgekit.profiles import data_dir, list_boards, load_board, load_target  # noqa: E402


@pytest.fixture(scope="module")
def int8_build(digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("android") / "int8"
    return convert(digits["model"], "android", out, precision="int8", calib=str(digits["calib"]),
                   eval_data=str(digits["eval"]))


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_int8_full_integer_with_int8_io(int8_build):
    man = int8_build.manifest
    art = man["artifact"]
    assert art["format"] == "tflite" and art["full_integer"] is True
    assert art["float_ops"] == []
    for t in art["io"]["inputs"] + art["io"]["outputs"]:
        assert t["dtype"] == "int8"
        assert isinstance(t["scale"], float) and t["scale"] > 0
        assert -128 <= t["zero_point"] <= 127
    assert "QUANTIZE" not in art["op_counts"] and "DEQUANTIZE" not in art["op_counts"]
    # one channel: NCHW -> NHWC is a RESHAPE, no TRANSPOSE at all
    assert art["transpose"]["total"] <= 1 and art["transpose"]["interior"] == 0
    # the model's ADD is counted as quantized, whoever annotated it (was: "0 add/mul node(s) annotated")
    assert art["op_counts"].get("ADD") == art["quantization"]["add_mul_quantized"] == 1


def test_int8_accuracy_within_one_point(int8_build):
    v = int8_build.verification
    assert v.passed, v.failures
    assert v.eval_samples == 450 and v.float_accuracy > 0.95
    assert 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0
    assert v.outputs[0].top1_agreement >= 0.9


def test_interpreter_matches_manifest_quantization(int8_build):
    from ai_edge_litert.interpreter import Interpreter

    out = int8_build.out_dir
    it = Interpreter(model_path=str(out / "model.tflite"))
    it.allocate_tensors()
    d = it.get_input_details()[0]
    man_in = int8_build.manifest["artifact"]["io"]["inputs"][0]
    assert d["dtype"] == np.int8
    assert d["quantization"][0] == pytest.approx(man_in["scale"]) and d["quantization"][1] == man_in["zero_point"]
    # the host runner dequantizes: golden outputs in the bundle are float logits of the float model
    g = np.load(out / "golden.npz")
    assert g["output_0"].dtype == np.float32


def test_host_latency_one_and_two_threads(int8_build):
    lat = int8_build.manifest["artifact"]["host_latency_ms"]
    assert set(lat) == {"1", "2"} and all(v > 0 for v in lat.values())
    assert any("median latency" in n for n in int8_build.manifest["notes"])


def test_bundle_runner_on_host(int8_build):
    out = int8_build.out_dir
    files = set(int8_build.manifest["files"])
    assert {"model.tflite", "run.py", "push_and_bench.sh", "README.md", "golden.npz"} <= files
    r = subprocess.run([sys.executable, str(out / "run.py"), "--iters", "20", "--threads", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "smoke_result.json").read_text())
    assert res["passed"] and res["runtime"].startswith("ai_edge_litert")
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["golden"]["passed"] and checks["integrity"]["passed"]
    assert res["latency_ms"]["p50"] > 0


def test_bundle_runner_detects_tampering(int8_build, tmp_path):
    import shutil

    b = tmp_path / "b"
    shutil.copytree(int8_build.out_dir, b)
    data = bytearray((b / "model.tflite").read_bytes())
    data[-1] ^= 0xFF
    (b / "model.tflite").write_bytes(bytes(data))
    r = subprocess.run([sys.executable, str(b / "run.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    res = json.loads((b / "smoke_result.json").read_text())
    assert not res["passed"] and "sha256" in res["checks"][0]["detail"]


def test_runner_is_python36_syntax():
    for name in ("run.py", "parse_benchmark.py"):
        src = (data_dir("firmware") / "tflite" / name).read_text()
        ast.parse(src, feature_version=(3, 6))


def test_parse_benchmark_model_output(tmp_path):
    log = tmp_path / "bm.log"
    log.write_text(
        "INFO: Loaded model /data/local/tmp/edgekit/model.tflite\n"
        "INFO: Inference timings in us: Init: 2410, First inference: 1830, "
        "Warmup (avg): 901.2, Inference (avg): 873.5\n"
        "INFO: Memory footprint delta from the start of the tool (MB): init=3.1 overall=4.2\n"
        "INFO: Peak memory footprint (MB): init=5.5 overall=7.25\n"
    )
    script = data_dir("firmware") / "tflite" / "parse_benchmark.py"
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(script), str(log), "--budget-ms", "0.5", "--output", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 1  # 0.8735 ms over a 0.5 ms budget
    res = json.loads(out.read_text())
    assert res["latency_avg_ms"] == pytest.approx(0.8735) and res["peak_memory_mb"]["overall"] == 7.25
    r = subprocess.run([sys.executable, str(script), str(log), "--budget-ms", "1", "--output", str(out)])
    assert r.returncode == 0
    log.write_text("ERROR: could not open model\n")
    assert subprocess.run([sys.executable, str(script), str(log), "--output", str(out)]).returncode == 2


def test_push_and_bench_shell_syntax():
    script = data_dir("firmware") / "tflite" / "push_and_bench.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    import shutil

    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8-dynamic"])
def test_float_and_dynamic_precisions(digits, tmp_path, precision):
    res = convert(digits["model"], "android", tmp_path / precision, precision=precision,
                  eval_data=str(digits["eval"]))
    art = res.manifest["artifact"]
    assert res.verification.passed, res.verification.failures
    assert art["io"]["inputs"][0]["dtype"] == "float32"
    size = res.manifest["files"]["model.tflite"]["bytes"]
    if precision == "fp32":
        assert "DEQUANTIZE" not in art["op_counts"] and v_rel(res) < 1e-4
    if precision == "fp16":  # fp16 weights, explicit DEQUANTIZE to fp32 compute
        assert art["op_counts"].get("DEQUANTIZE", 0) >= 3
        assert size < 50_000
    if precision == "int8-dynamic":
        assert art["quantization"]["weights"].startswith("int8") and size < 30_000


def v_rel(res):
    return res.verification.outputs[0].max_rel_error


def test_fp32_matches_float_model(digits, tmp_path):
    res = convert(digits["model"], "android", tmp_path / "fp32", precision="fp32")
    assert res.verification.outputs[0].max_rel_error < 1e-4
    assert res.manifest["artifact"]["io"]["inputs"][0]["dtype"] == "float32"


def test_calibration_with_wrong_shape_names_expected(digits, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, image=np.zeros((10, 1, 4, 4), np.float32))
    with pytest.raises(InputSpecError, match=r"expects \[N, 1, 8, 8\]"):
        convert(digits["model"], "android", tmp_path / "o", precision="int8", calib=str(bad))
    assert not (tmp_path / "o").exists()


DD_MODULE = """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 2)
    def forward(self, x):
        if x.sum() > 0:
            return self.l(x)
        return -self.l(x)
def make():
    return M()
"""


def test_data_dependent_control_flow_is_named(tmp_path, monkeypatch):
    from edgekit.errors import EdgekitError

    (tmp_path / "ddmod_android.py").write_text(DD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EdgekitError, match="data-dependent control flow"):
        convert("ddmod_android:make", "android", tmp_path / "o", precision="fp32", input_shape=["1,4"])
    assert not (tmp_path / "o").exists()


def test_litert_failure_messages():
    from edgekit.converters.common.pt2e import explain_export_failure as _explain_export_failure

    msg = _explain_export_failure(RuntimeError("Could not guard on data-dependent expression u0 > 0"), "m.pt2")
    assert "data-dependent control flow" in msg and "fixed input shapes" in msg and "torch.cond" in msg
    assert "could not convert" in _explain_export_failure(ValueError("boom"), "m.pt2")


def test_profiles_valid_and_cpu_figures():
    t = load_target("android")
    assert t.converter == "tflite" and "int8" in t.precisions and "int8-dynamic" in t.precisions
    ids = {b.id for b in list_boards("android")}
    assert {"google/pixel-8", "samsung/galaxy-s24", "raspberrypi/rpi-5", "generic/android-arm64"} <= ids
    for bid in ids:
        b = load_board(bid)
        assert b.precisions == ["fp32", "fp16", "int8-dynamic", "int8"]
        for m in b.power_modes.values():
            assert m.peak_tops["int8"] >= m.peak_tops["fp16"] >= m.peak_tops["fp32"]
        assert b.budgets.power_w <= max(m.power_w for m in b.power_modes.values())


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_int8_with_float_io(digits, tmp_path):
    res = convert(digits["model"], "android", tmp_path / "iof", precision="int8", calib=str(digits["calib"]),
                  eval_data=str(digits["eval"]), options={"io": "float"})
    art = res.manifest["artifact"]
    assert [t["dtype"] for t in art["io"]["inputs"] + art["io"]["outputs"]] == ["float32", "float32"]
    assert art["op_counts"]["QUANTIZE"] == 1 and art["op_counts"]["DEQUANTIZE"] == 1
    assert art["full_integer"] and art["float_ops"] == []  # the edge QUANTIZE/DEQUANTIZE are what was asked
    assert art["int8_io"]["inputs"][0]["dtype"] == "int8" and art["int8_io"]["inputs"][0]["scale"] > 0
    v = res.verification
    assert v.passed and 100 * (v.float_accuracy - v.converted_accuracy) <= 1.0


FAKE_ADB = r"""#!/usr/bin/env bash
# FakeAdb: stands in for a phone. Files pushed land under $FAKE_PHONE; `shell` runs a few commands.
set -e
[ "$1" = "-s" ] && shift 2
root="$FAKE_PHONE"
case "$1" in
  get-state) echo device ;;
  push) mkdir -p "$root$(dirname "$3")"; cp "$2" "$root$3" ;;
  shell)
    shift
    set -- $*
    case "$1" in
      mkdir) mkdir -p "$root$3" ;;
      sha256sum) sha256sum "$root$2" | sed "s#$root##" ;;
      chmod) chmod "$2" "$root$3" ;;
      getprop) echo "FakePhone 8" ;;
      */benchmark_model)
        echo "INFO: Graph: [$2]"
        printf "INFO: Inference timings in us: Init: 1500, First inference: 900, "
        echo "Warmup (avg): 420.5, Inference (avg): 401.25" ;;
      *) echo "fake adb: unknown shell command $*" >&2; exit 1 ;;
    esac ;;
  *) echo "fake adb: unknown command $1" >&2; exit 1 ;;
esac
"""


def test_push_and_bench_with_fake_adb(int8_build, tmp_path):
    """No phone here: a FakeAdb script on PATH plays one (push, sha256sum, benchmark_model output)."""
    import os
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(int8_build.out_dir, bundle)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "adb").write_text(FAKE_ADB)
    (bindir / "adb").chmod(0o755)
    bm = tmp_path / "benchmark_model"
    bm.write_text("#!/bin/sh\n")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_PHONE": str(tmp_path / "phone")}
    r = subprocess.run(["bash", str(bundle / "push_and_bench.sh"), "--benchmark-model", str(bm), "--threads", "2"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((bundle / "bench_result.json").read_text())
    assert res["latency_avg_ms"] == pytest.approx(0.40125) and res["device"] == "FakePhone 8" and res["passed"]
    pushed = tmp_path / "phone/data/local/tmp/edgekit/model.tflite"
    assert pushed.read_bytes() == (bundle / "model.tflite").read_bytes()
    # a model that changes on the way is refused before any timing
    (bundle / "model.tflite").write_bytes(b"not the model")
    r = subprocess.run(["bash", str(bundle / "push_and_bench.sh"), "--benchmark-model", str(bm)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "sha256" in r.stderr


def test_fp32_notes_do_not_call_every_op_a_float_op(digits, tmp_path):
    """At fp32 every op computes in float by request: the op report does not list them as "float ops" (that list,
    and the missing int8 kernels, are for full-integer int8 builds)."""
    from edgekit.pipeline import convert

    res = convert(digits["model"], target="android", precision="fp32", out=tmp_path / "o", golden_count=8)
    report = next(n for n in res.notes if n.startswith("op report after converting"))
    assert "float ops" not in report and "int8 kernel" not in report, report
    assert "FULLY_CONNECTED" in report or "CONV_2D" in report
