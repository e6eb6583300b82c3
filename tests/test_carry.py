"""A carried recurrent state (``--carry state_out=state``): the GRU built in tests/support/recurrent.py runs over
scikit-learn's digits read as a time series (each 8x8 digit is two chunks of four pixel rows, digit after digit),
calibrated on the states the float model carries over the sequence, and verified with the float model and the
converted model each carrying its own state over a sequence of 32 chunks."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import InputSpecError

pytest.importorskip("torch")

SEQUENCE = 64  # chunks per sequence in the calibration file (32 digits)


@pytest.fixture(scope="module")
def gru(tmp_path_factory):
    from recurrent import build
    from sklearn.datasets import load_digits

    folder = tmp_path_factory.mktemp("gru")
    paths = build(folder)
    rows = load_digits().images.astype(np.float32) / 16.0  # [1797, 8, 8]: pixel rows, top to bottom
    np.savez(folder / "digits_seq.npz", x=rows[:160].reshape(-1, 4, 8))  # 320 chunks, 5 sequences; no state
    np.savez(folder / "digits_eval.npz", x=rows[1000:1048].reshape(-1, 4, 8))  # 96 chunks
    return {**paths, "seq": folder / "digits_seq.npz", "eval": folder / "digits_eval.npz"}


def test_calibration_states_are_the_float_models_carried_over_each_sequence(gru):
    """Chunk k takes the state the float model handed back after chunk k-1; each sequence starts from zeros."""
    import onnxruntime as ort

    from edgekit.carry import make_carry, with_states
    from edgekit.data import load_npz
    from edgekit.ingest import load_model

    m = load_model(gru["onnx"], batch_axes=["state=1"])
    carry = make_carry(m, ["state_out=state"], SEQUENCE)
    ds = with_states(m, load_npz(gru["seq"], m, generated=carry.inputs), carry)
    assert ds.inputs["state"].shape == (320, 2, 16)
    sess = ort.InferenceSession(str(gru["onnx"]), providers=["CPUExecutionProvider"])
    h = np.zeros((2, 1, 16), np.float32)
    for k in range(2 * SEQUENCE):
        if k % SEQUENCE == 0:
            h = np.zeros_like(h)
        np.testing.assert_allclose(ds.inputs["state"][k], h[:, 0], atol=1e-6)
        h = sess.run(None, {"x": ds.inputs["x"][k:k + 1], "state": h})[1]
    assert np.abs(ds.inputs["state"][SEQUENCE - 1]).max() > 0.1  # real states, not zeros


@pytest.mark.parametrize(("target", "precision", "bound"), [("jetson", "fp32", 1e-4), ("jetson", "int8", 0.15),
                                                            ("android", "fp32", 1e-4)])
def test_carried_state_verified_chunk_by_chunk(gru, tmp_path, target, precision, bound):
    """The state stays an input and an output; the calibration file holds only x; the golden samples are the
    first 32 chunks of the file's last sequence, in order, held out of calibration; each model carries its own
    state over them, and the per-chunk figures are in the verification, the manifest and the report."""
    from edgekit.pipeline import convert

    res = convert(gru["onnx"], target=target, precision=precision, calib=str(gru["seq"]), batch_axes=["state=1"],
                  carries=["state_out=state"], sequence_length=SEQUENCE, golden_count=32, out=tmp_path / target,
                  cache=False)
    v = res.verification
    assert v.passed and v.golden_samples == 32
    c = v.carried
    assert c["chunks"] == 32 and c["passed"] and c["pairs"] == [{"output": "state_out", "input": "state"}]
    for name in ("logits", "state_out"):
        o = c["outputs"][name]
        assert len(o["per_chunk_rel_error"]) == 32 and o["passed"] and o["max_rel_error"] <= bound
        assert o["first_chunk_rel_error"] == o["per_chunk_rel_error"][0]
        assert o["last_chunk_rel_error"] == o["per_chunk_rel_error"][-1]
    assert c["outputs"]["state_out"]["state"] and not c["outputs"]["logits"]["state"]
    man = res.manifest
    assert man["carry"]["pairs"] == [{"output": "state_out", "input": "state"}]
    assert man["carry"]["sequence_length"] == SEQUENCE
    assert man["golden"]["selection"]["sequence"] == [256, 288]  # the start of the last sequence
    assert man["golden"]["selection"]["held_out_of_calibration"] == 32 and man["calibration"]["samples"] == 288
    assert man["verification"]["carried"]["outputs"]["logits"]["per_chunk_rel_error"] == \
        c["outputs"]["logits"]["per_chunk_rel_error"]
    assert [i["name"] for i in man["inputs"]] == ["x", "state"]  # the state stays an input of the artifact
    report = (res.out_dir / "report.md").read_text()
    assert "### Carried state (`state_out` → `state`)" in report and "chunks 256 to 287 in order" in report
    with np.load(res.out_dir / "golden.npz") as z:  # the board checks each chunk with the float model's state
        assert z["input_1"].shape == (32, 2, 16) and not z["input_1"][0].any() and z["input_1"][1].any()


def test_eval_sequences_run_each_model_with_its_own_state(gru, tmp_path):
    """With --eval, the golden sequence comes from the eval file and every eval sequence runs carried."""
    from edgekit.pipeline import convert

    res = convert(gru["onnx"], target="jetson", precision="fp32", calib=str(gru["seq"]), eval_data=str(gru["eval"]),
                  batch_axes=["state=1"], carries=["state_out=state"], sequence_length=48, golden_count=16,
                  out=tmp_path / "b", cache=False)
    v = res.verification
    assert v.passed and v.eval_samples == 96 and v.carried["chunks"] == 16
    assert res.manifest["golden"]["selection"] == {"from": "eval", "sequence": [48, 64], "in_order": True,
                                                   "held_out_of_calibration": 0}
    assert v.eval_agreement["state_out"]["max_rel_error"] < 1e-4


def test_a_wrong_carry_names_the_flag(gru):
    from edgekit.carry import make_carry
    from edgekit.ingest import load_model

    m = load_model(gru["onnx"], batch_axes=["state=1"])
    with pytest.raises(InputSpecError, match=r"--carry state_outt=state: the model has no output 'state_outt' "
                                             r"\(its inputs: x, state; outputs: logits, state_out\)"):
        make_carry(m, ["state_outt=state"])
    with pytest.raises(InputSpecError, match=r"--carry state=state_out: .*give the output first: --carry "
                                             "state_out=state"):
        make_carry(m, ["state=state_out"])
    with pytest.raises(InputSpecError, match=r"--carry state_out=h: the model has no input 'h'"):
        make_carry(m, ["state_out=h"])
    with pytest.raises(InputSpecError, match=r"--carry logits=state: output 'logits' has shape \[1, 3\], input "
                                             r"'state' takes \[2, 1, 16\]"):
        make_carry(m, ["logits=state"])
    with pytest.raises(InputSpecError, match="--carry 'state_out': expected OUTPUT=INPUT"):
        make_carry(m, ["state_out"])
    with pytest.raises(InputSpecError, match="--sequence-length 8: .*give --carry OUTPUT=INPUT too"):
        make_carry(m, None, 8)
    static = load_model(gru["pt2"])  # outputs output_0, output_1; state [2, 1, 16] batched on axis 0 unless declared
    with pytest.raises(InputSpecError, match=r"--carry output_1=state: .*'state' holds 2 on its batch axis 0; if "
                                             r"the batch of 'state' \[2, 1, 16\] is on another axis, give "
                                             "--batch-axis state=AXIS"):
        make_carry(static, ["output_1=state"])
    assert make_carry(load_model(gru["pt2"], batch_axes=["state=1"]), ["output_1=state"]).inputs == {"state"}


def test_the_cli_refuses_a_wrong_carry_in_one_line(gru, tmp_path, monkeypatch, capsys):
    from cli_in_process import run_cli

    code, out, err = run_cli(monkeypatch, capsys, "convert", str(gru["onnx"]), "--target", "jetson", "-p", "fp32",
                             "--calib", str(gru["seq"]), "--batch-axis", "state=1", "--carry", "hidden=state",
                             "-o", str(tmp_path / "b"), "--no-cache")
    text = " ".join((out + err).split())
    assert code != 0 and "--carry hidden=state: the model has no output 'hidden'" in text, text
    assert "Traceback" not in out + err and not (tmp_path / "b").exists()


def test_a_carried_build_is_cached_with_its_figures_and_the_sequence_rule_is_a_key(gru, tmp_path):
    from edgekit.pipeline import convert

    def build(out: str, length: int):
        return convert(gru["onnx"], target="jetson", precision="fp32", calib=str(gru["seq"]), batch_axes=["state=1"],
                       carries=["state_out=state"], sequence_length=length, golden_count=16, out=tmp_path / out,
                       cache_dir=tmp_path / "cache")

    first, again, other = build("a", SEQUENCE), build("b", SEQUENCE), build("c", 32)
    assert not first.cache["hit"] and again.cache["hit"] and not other.cache["hit"]
    assert again.verification.carried == first.verification.carried
    assert other.manifest["golden"]["selection"]["sequence"] == [288, 304]


def test_the_runner_carries_its_own_state_over_the_golden_chunks():
    """firmware/common/edgekit_smoke.run_carried: the first golden chunk takes the golden (zero) state, every later
    chunk the state the artifact handed back for the chunk before it, never the golden (float) state."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    n = 4
    g = {"input_0": np.arange(n, dtype=np.float32).reshape(n, 1), "input_1": np.full((n, 2, 3), 7.0, np.float32)}
    g["input_1"][0] = 0.0
    man = {"carry": {"pairs": [{"output": "s_out", "input": "s"}]},
           "golden": {"samples": n, "inputs": [{"name": "x", "key": "input_0", "shape": [1, 1]},
                                                {"name": "s", "key": "input_1", "shape": [2, 1, 3], "batch_axis": 1}],
                      "outputs": [{"name": "y", "key": "output_0"}, {"name": "s_out", "key": "output_1"}]}}
    seen = []

    def run(feed):  # the state counts the chunks: s_out = s + 1
        seen.append(feed["s"].copy())
        return [feed["x"] * 2, feed["s"] + 1]

    outs = smoke.run_carried(run, g, man)
    assert len(outs) == n and [float(s.max()) for s in seen] == [0.0, 1.0, 2.0, 3.0]
    assert all(s.shape == (2, 1, 3) for s in seen)
    assert smoke.carried_pairs({"golden": {}}) == []


def test_the_bundle_runner_runs_the_golden_sequence_carried(gru, tmp_path):
    """The jetson bundle's run.py on this host (onnxruntime): the golden chunks run in order, the artifact's own
    state fed from chunk to chunk, and pass; the check says the state was carried."""
    import json
    import subprocess
    import sys

    from edgekit.pipeline import convert

    res = convert(gru["onnx"], target="jetson", precision="fp32", calib=str(gru["seq"]), batch_axes=["state=1"],
                  carries=["state_out=state"], sequence_length=SEQUENCE, golden_count=16, out=tmp_path / "b",
                  cache=False)
    r = subprocess.run([sys.executable, str(res.out_dir / "run.py"), "--runtime", "onnxruntime", "--iters", "3",
                        "--warmup", "1", "--output", str(tmp_path / "smoke.json")], check=False, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    golden = next(c for c in json.loads((tmp_path / "smoke.json").read_text())["checks"] if c["name"] == "golden")
    assert golden["passed"] and "16 samples; state carried chunk to chunk (state_out -> state)" in golden["detail"]
    assert golden["carried"] == [{"output": "state_out", "input": "state"}]
