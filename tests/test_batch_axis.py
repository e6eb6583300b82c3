"""Inputs whose batch is not on axis 0 (``--batch-axis``): a recurrent model built here whose state goes in as
``state[2, B, 16]`` and comes back out, converted for jetson and android with the state kept as an input and an
output, verified against the float model, and run by the bundle's runner; the data files stay samples first."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgekit.errors import InputSpecError
from edgekit.ingest import load_model

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gru(tmp_path_factory):
    from recurrent import build

    return build(tmp_path_factory.mktemp("gru"))


def test_the_declared_axis_is_where_samples_go(gru):
    from edgekit.data import load_npz

    m = load_model(gru["onnx"], batch_axes=["state=1"])
    state, out = m.inputs[1], m.outputs[1]
    assert (state.shape, state.batch_axis, state.sample_shape) == ((2, 1, 16), 1, (2, 16))
    assert out.name == "state_out" and out.batch_axis == 1  # shaped like the state input: batched as it is
    assert m.inputs[0].to_json().get("batch_axis") is None and state.to_json()["batch_axis"] == 1
    ds = load_npz(gru["data"], m)
    feeds = list(ds.batches(m, 3))
    assert len(feeds) == 3 and feeds[1]["state"].shape == (2, 1, 16) and feeds[1]["x"].shape == (1, 4, 8)
    np.testing.assert_array_equal(feeds[1]["state"][:, 0], ds.inputs["state"][1])


def test_a_missing_or_wrong_batch_axis_names_the_flag(gru):
    from edgekit.data import load_npz

    with pytest.raises(InputSpecError, match=r"dynamic dimensions \[2, B, 16\].*--batch-axis state=1"):
        load_model(gru["onnx"])
    static = load_model(gru["pt2"])  # static state [2, 1, 16]: the file's [N, 2, 16] fits only on axis 1
    with pytest.raises(InputSpecError, match=r"expects \[N, 1, 16\] \(samples first\); if the model's batch is on "
                                             r"axis 1 of 'state' \[2, 1, 16\], give --batch-axis state=1"):
        load_npz(gru["data"], static)
    with pytest.raises(InputSpecError, match=r"batch axes hold different numbers of samples \(x has 1 on axis 0, "
                                             r"state has 16 on axis 2\); declare each input's batch axis with "
                                             "--batch-axis"):
        load_model(gru["pt2"], batch_axes=["state=2"])
    wrong = load_model(gru["pt2"], batch_axes=["state=none"])
    with pytest.raises(InputSpecError, match=r"expects \[N, 2, 1, 16\] \(no batch axis: .*give --batch-axis state=1"):
        load_npz(gru["data"], wrong)
    with pytest.raises(InputSpecError, match=r"--batch-axis state=3: input 'state' has shape \[2, 1, 16\], which "
                                             "has no axis 3"):
        load_model(gru["pt2"], batch_axes=["state=3"])
    with pytest.raises(InputSpecError, match="the model has no input or output 'h'"):
        load_model(gru["pt2"], batch_axes=["h=1"])
    with pytest.raises(InputSpecError, match="expected NAME=AXIS or NAME=none"):
        load_model(gru["pt2"], batch_axes=["state"])


def test_the_runner_places_golden_samples_on_each_batch_axis():
    """firmware/common/edgekit_smoke.golden_feeds: samples first in golden.npz, moved to each input's axis."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    g = {"input_0": np.arange(6, dtype=np.float32).reshape(3, 2), "input_1": np.arange(12.0).reshape(3, 2, 2),
         "input_2": np.arange(3.0).reshape(3, 1)}
    man = {"golden": {"samples": 3, "inputs": [{"name": "x", "key": "input_0", "shape": [1, 2]},
                                                {"name": "s", "key": "input_1", "shape": [2, 1, 2], "batch_axis": 1},
                                                {"name": "k", "key": "input_2", "shape": [1], "batch_axis": "none"}]}}
    feeds = smoke.golden_feeds(g, man)
    assert len(feeds) == 3 and feeds[2]["s"].shape == (2, 1, 2) and feeds[2]["k"].shape == (1,)
    np.testing.assert_array_equal(feeds[2]["s"][:, 0], g["input_1"][2])
    merged, axes = smoke.merge_batches([[f["s"], f["k"]] for f in feeds], 1, [1, "none"])
    assert axes == [1, "none"] and merged[0].shape == (3, 2, 2) and merged[1].shape == (3, 1)
    np.testing.assert_array_equal(merged[0], g["input_1"])


@pytest.mark.parametrize("target", ["jetson", "android"])
def test_recurrent_state_stays_an_input_and_an_output(gru, tmp_path, target):
    """fp32 on jetson (onnxruntime) and android (LiteRT, the ONNX bridged to torch): the state is an input and
    an output of the artifact, every golden chunk agrees with the float model, and the bundle's runner feeds the
    golden states on axis 1 and passes on this host."""
    from edgekit.pipeline import convert

    res = convert(gru["onnx"], target=target, precision="fp32", calib=str(gru["data"]), batch_axes=["state=1"],
                  out=tmp_path / target, golden_count=16)
    v = res.verification
    assert v.passed and v.golden_samples == 16
    checks = {o.name: o for o in v.outputs}
    assert checks["state_out"].batch_axis == 1 and checks["state_out"].max_rel_error < 1e-4
    man = res.manifest
    assert [(i["name"], i["shape"], i.get("batch_axis")) for i in man["inputs"]] == [
        ("x", [1, 4, 8], None), ("state", [2, 1, 16], 1)]
    gin = {g["name"]: g for g in man["golden"]["inputs"]}
    assert gin["state"]["batch_axis"] == 1
    with np.load(res.out_dir / "golden.npz") as z:
        assert z[gin["state"]["key"]].shape == (16, 2, 16)  # samples first, as the data file holds them
        assert z["output_1"].shape == (16, 2, 16)
    args = ["--runtime", "onnxruntime"] if target == "jetson" else ["--threads", "1"]
    r = subprocess.run([sys.executable, str(res.out_dir / "run.py"), *args, "--iters", "5", "--warmup", "1",
                        "--output", str(tmp_path / "smoke.json")], check=False, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    golden = next(c for c in json.loads((tmp_path / "smoke.json").read_text())["checks"] if c["name"] == "golden")
    assert golden["passed"] and "16 samples" in golden["detail"]
