"""Verification: an artifact the host runtime cannot load is a failed build (one line, kept, marked failed)."""

from __future__ import annotations

import json

import pytest

from edgekit.errors import VerificationError


def test_artifact_that_does_not_load_is_a_failed_build_not_a_traceback(digits, tmp_path, monkeypatch):
    """A converter that writes an ONNX file onnxruntime refuses (as quantize_static did with a mixed-rank Concat
    on a real OCR model): the load-and-run check names the runtime and its message; the build is kept, marked
    failed, and `edgekit bundle` refuses it."""
    from edgekit.bundle import BundleError, make_bundle
    from edgekit.converters.tensorrt import converter as tensorrt
    from edgekit.pipeline import convert

    real = tensorrt.CONVERTER.convert

    def broken_converter(job):  # a fake toolchain bug: the real artifact, then its graph damaged
        art = real(job)
        path = job.out_dir / art.primary
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
        return art

    monkeypatch.setattr(tensorrt.CONVERTER, "convert", broken_converter)
    out = tmp_path / "b"
    with pytest.raises(VerificationError, match=r"does not load or run in onnxruntime .*\(\w+: .+\)"):
        convert(digits["model"], "jetson", out, board="host", precision="fp32")
    man = json.loads((out / "manifest.json").read_text())
    assert man["verification"]["passed"] is False and man["verification"]["outputs"] == []
    assert "FAILED" in (out / "report.md").read_text()
    with pytest.raises(BundleError, match="host verification failed.*does not load"):
        make_bundle(out, tmp_path / "b.tar.gz")


def test_wilson_interval_says_what_few_samples_can_tell():
    from edgekit.verify import wilson

    lo16, hi16 = wilson(1.0, 16)  # 16/16 agree: still as low as 80.6% at 95%
    assert 0.79 < lo16 < 0.82 and hi16 == 1.0
    lo, hi = wilson(0.5, 1000)
    assert 0.468 < lo < 0.47 and 0.53 < hi < 0.532
    assert wilson(0.0, 50)[0] == 0.0 and wilson(0.9, 0) == (0.0, 1.0)


def test_report_shows_intervals_and_how_golden_samples_were_drawn(digits, tmp_path):
    from edgekit.pipeline import convert

    res = convert(digits["model"], "jetson", tmp_path / "b", board="host", precision="int8",
                  calib=str(digits["calib"]), eval_data=str(digits["eval"]))
    report = (res.out_dir / "report.md").read_text()
    assert "95% CI" in report and "drawn across the file stratified by label, seed 0" in report
    v = res.verification
    assert v.converted_accuracy_ci95[0] <= v.converted_accuracy <= v.converted_accuracy_ci95[1]
    # the paired counts are the two accuracies' difference, sample by sample
    assert abs((v.accuracy_won - v.accuracy_lost) / v.eval_samples - (v.converted_accuracy - v.float_accuracy)) < 1e-9
    drop = 100 * (v.float_accuracy - v.converted_accuracy)
    assert v.accuracy_drop_ci95[0] - 1e-9 <= drop <= v.accuracy_drop_ci95[1] + 1e-9
    assert "paired 95% CI" in report and f"{v.accuracy_lost} wrong that float gets right" in report


def test_paired_accuracy_drop_counts_the_samples_that_differ():
    """The drop's interval comes from the samples the two models judge differently: ten lost and none won on
    1000 is a real drop (its interval excludes 0), ten lost and ten won is none (an interval about 0), and two
    identical models have no interval width at all."""
    import numpy as np

    from edgekit.verify import accuracy_drop

    f = np.ones(1000, bool)
    q = f.copy()
    q[:10] = False
    d = accuracy_drop(f, q)
    assert (d["lost"], d["won"]) == (10, 0) and abs(d["drop"] - 1.0) < 1e-9
    assert 0.4 < d["ci95"][0] < 0.5 and abs(d["ci95"][1] - 1.0) < 1e-9  # 1% x (2 x Wilson 72.2%-100% of 10/10 - 1)
    f[990:] = False  # ten samples float gets wrong and the converted model right
    d = accuracy_drop(f, q)
    assert (d["lost"], d["won"]) == (10, 10) and d["drop"] == 0.0
    assert -2.0 < d["ci95"][0] < -0.5 and abs(d["ci95"][0] + d["ci95"][1]) < 1e-9
    assert accuracy_drop(f, f) == {"drop": 0.0, "ci95": (0.0, 0.0), "lost": 0, "won": 0}


def _sorted_eval(tmp_path):
    import numpy as np

    from conftest import DIGITS

    with np.load(DIGITS / "eval.npz") as z:
        x, y = z["image"], z["label"]
    order = np.argsort(y, kind="stable")  # by class: the first samples are all zeros and ones
    path = tmp_path / "sorted_eval.npz"
    np.savez(path, image=x[order], label=y[order])
    return path, y[order]


def test_a_build_that_breaks_one_class_fails_although_the_class_is_not_first(digits, tmp_path, monkeypatch):
    """A build that misreads one class (9, the last in the sorted file) passes a first-16 golden check and is
    failed by golden samples drawn across the file, stratified by label."""
    import numpy as np
    import onnx

    from edgekit.converters.tensorrt import converter as tensorrt
    from edgekit.pipeline import convert

    path, y = _sorted_eval(tmp_path)
    assert set(y[:16]) == {0} and 9 not in set(y[:400])  # the first 16 (the old golden set) are all zeros
    real = tensorrt.CONVERTER.convert

    def misreads_nines(job):  # a fake toolchain bug: the real artifact with class 9's logit pushed down
        art = real(job)
        proto = onnx.load(str(job.out_dir / art.primary))
        gemm = next(n for n in reversed(proto.graph.node) if n.op_type == "Gemm")
        bias = next(i for i in proto.graph.initializer if i.name == gemm.input[2])
        b = onnx.numpy_helper.to_array(bias).copy()
        b[9] -= 1e4
        bias.CopyFrom(onnx.numpy_helper.from_array(b, bias.name))
        onnx.save(proto, str(job.out_dir / art.primary))
        return art

    monkeypatch.setattr(tensorrt.CONVERTER, "convert", misreads_nines)
    with pytest.raises(VerificationError, match=r"top-1 agrees with float on 9\d\.\d% of 64 golden samples"):
        convert(digits["model"], "jetson", tmp_path / "b", board="host", precision="fp32", eval_data=str(path))
    man = json.loads((tmp_path / "b" / "manifest.json").read_text())
    sel = man["golden"]["selection"]
    assert sel["stratified"] and 9 in set(y[np.asarray(sel["indices"])])
    # the old check, the first 16 samples of the file, would have passed this very build (kept, marked failed)
    import onnxruntime as ort
    import torch

    with np.load(path) as z:
        x = z["image"]
    sess = ort.InferenceSession(str(tmp_path / "b" / "model.onnx"), providers=["CPUExecutionProvider"])
    ref = torch.export.load(str(digits["model"])).module()
    agree = [int(np.argmax(sess.run(None, {sess.get_inputs()[0].name: x[i:i + 1]})[0]))
             == int(ref(torch.from_numpy(x[i:i + 1])).argmax()) for i in (*range(16), *np.flatnonzero(y == 9)[:5])]
    assert all(agree[:16]) and not any(agree[16:])


def test_two_heads_each_judged_by_its_kind_and_labels_scored_on_the_named_head(tmp_path):
    """A box regression head first, a class head second: the box is judged by SNR / abs error (never top-1),
    labels are scored on the class head (by default, and by --eval-output), and naming a regression head for
    labels, or an unknown output, is a one-line error before any work."""
    import torch

    from conftest import DIGITS
    from edgekit.errors import InputSpecError
    from edgekit.pipeline import convert
    from plan_nets import two_heads

    net = two_heads()
    pt2 = tmp_path / "two_heads.pt2"
    torch.export.save(torch.export.export(net, (torch.zeros(1, 1, 8, 8),)), str(pt2))
    res = convert(pt2, "jetson", tmp_path / "b", board="host", precision="int8", calib=str(DIGITS / "calib.npz"),
                  eval_data=str(DIGITS / "eval.npz"))
    box, prob = res.verification.outputs
    assert (box.kind, prob.kind) == ("regression", "class")
    assert box.top1_agreement is None and box.metrics["snr_db"] > 15 and 0.99 < box.metrics["cosine"] <= 1.0
    assert prob.top1_agreement is not None and prob.top1_agreement >= 0.9
    v = res.verification
    assert v.eval_output == prob.name and v.float_accuracy > 0.8  # scored on the class head, not on the box
    man = res.manifest
    assert [o["kind"] for o in man["golden"]["outputs"]] == ["regression", "class"]  # what the board judges by
    named = convert(pt2, "jetson", tmp_path / "c", board="host", precision="fp32", eval_data=str(DIGITS / "eval.npz"),
                    eval_output=prob.name)
    assert named.verification.eval_output == prob.name
    with pytest.raises(InputSpecError, match="--eval-output nope: the model has no output"):
        convert(pt2, "jetson", tmp_path / "d", board="host", precision="fp32", eval_data=str(DIGITS / "eval.npz"),
                eval_output="nope")
    with pytest.raises(InputSpecError, match="--output-kind .*choose one of"):
        convert(pt2, "jetson", tmp_path / "d", board="host", precision="fp32", output_kinds={prob.name: "label"})
    # the user overrides the inference: the box as a class output is judged by top-1 agreement
    over = convert(pt2, "jetson", tmp_path / "e", board="host", precision="fp32", output_kinds={box.name: "class"},
                   eval_data=str(DIGITS / "eval.npz"), eval_output=prob.name)
    assert over.verification.outputs[0].kind == "class" and over.verification.outputs[0].top1_agreement is not None


def test_tiny_range_output_has_an_absolute_floor():
    """A voice-activity probability near 0.01 on silence: an fp16 error of 0.001 is 10% of its range, but not a
    failure where the profile's abs_floor allows it; the same error on a unit-range output is judged relative."""
    import numpy as np

    from edgekit.verify import output_checks

    smoke = output_checks()
    ref = np.full((8, 1), 0.01)
    got = ref + 0.001
    tol = {"max_rel_error": 0.01, "abs_floor": 0.002, "min_top1_agreement": 0.99}
    assert smoke.check_output("vad", "regression", ref, got, tol)["passed"]
    assert not smoke.check_output("vad", "regression", ref, got, {**tol, "abs_floor": 0.0})["passed"]
    r = smoke.check_output("vad", "regression", ref, got, {**tol, "min_snr_db": 30})
    assert not r["passed"] and "SNR" in r["failures"][0]  # 20 dB: the floor does not hide a poor SNR when asked


def test_onnxruntime_load_bug_is_retried_with_basic_optimization_and_recorded(digits, tmp_path, monkeypatch):
    """onnxruntime 1.32 fails to load some Q/DQ graphs (a YOLOv8n, paddle OCR models) only when precision mode
    meets ORT_ENABLE_ALL. Here that bug is a fake (the digits graph loads fine): a session that refuses those
    options. The runner retries with ORT_ENABLE_BASIC, the build verifies, and the manifest says so."""
    import onnxruntime as ort

    from edgekit.pipeline import convert

    real = ort.InferenceSession

    def fake_ort_bug(path, sess_options=None, *args, **kw):
        opts = sess_options
        if opts is not None and opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL \
                and opts.get_session_config_entry("session.x64quantprecision") == "1":
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : AddInitializedOrtValue: Attempt to replace the "
                               "existing tensor")
        return real(path, sess_options, *args, **kw)

    monkeypatch.setattr(ort, "InferenceSession", fake_ort_bug)
    res = convert(digits["model"], "jetson", tmp_path / "b", board="host", precision="int8",
                  calib=str(digits["calib"]))
    assert res.verification.passed
    assert any("ORT_ENABLE_BASIC" in w for w in res.manifest["warnings"])


def test_mask_without_positives_is_judged_by_its_values():
    """A wake-word score on speech without the word: no sample reaches 0.5 in either model, so IoU compares nothing
    (1.0 over an empty union). The values are judged instead: a score that moved from 0.3 to 0.0 fails; a
    probability near zero that stays near zero passes. With positives, the decision (IoU) is the check."""
    import numpy as np

    from edgekit.verify import output_checks

    smoke = output_checks()
    tol = {"max_rel_error": 0.15, "abs_floor": 0.01, "min_iou": 0.9, "min_top1_agreement": 0.9}
    ref = np.linspace(0.0, 0.3, 16).reshape(16, 1)
    r = smoke.check_output("wake", "mask", ref, np.zeros_like(ref), tol)
    assert not r["passed"] and "iou" not in r  # no IoU is reported over nothing
    assert smoke.check_output("wake", "mask", ref * 1e-3, np.zeros_like(ref), tol)["passed"]
    prob = np.where(np.arange(64) % 8 == 0, 0.9, 0.05).reshape(64, 1)
    moved = prob + np.where(prob > 0.5, -0.3, 0.3)  # both decisions unchanged (0.6 and 0.35), values moved by 0.3
    r = smoke.check_output("wake", "mask", prob, moved, tol)
    assert r["passed"] and r["iou"] == 1.0


def test_detection_head_is_judged_by_its_detections_and_their_boxes():
    """A YOLO-style head [N, anchors, 4 box + objectness + class]: a background anchor's box moving far does not
    fail the build (a max-error check over every anchor did); a lost detection or a moved detected box does."""
    import numpy as np

    from edgekit.verify import output_checks

    smoke = output_checks()
    tol = {"max_rel_error": 0.15, "abs_floor": 0.01, "min_iou": 0.9, "min_snr_db": 15.0, "min_top1_agreement": 0.9}
    rng = np.random.default_rng(0)
    ref = np.concatenate([rng.uniform(0, 3, (8, 100, 4)), np.full((8, 100, 1), 0.01), np.full((8, 100, 1), 0.9)], -1)
    ref[:, :10, 4] = 0.8  # 10 detections per sample (score 0.72), 90 background anchors (0.009)
    got = ref.copy()
    got[:, 50:, :4] += 2.5  # background boxes moved by most of the range
    r = smoke.check_output("out", "detection", ref, got, tol)
    assert r["passed"] and r["iou"] == 1.0 and r["detections"] == 80, r["failures"]
    assert not smoke.check_output("out", "regression", ref, got, tol)["passed"]  # what the old judgement said
    lost = ref.copy()
    lost[:, :2, 4] = 0.1  # 2 of 10 detections per sample fall under the threshold: IoU 0.8
    r = smoke.check_output("out", "detection", ref, lost, tol)
    assert not r["passed"] and "IoU 0.800" in r["failures"][0]
    moved = ref.copy()
    moved[:, :10, :4] += 1.5  # the detected boxes moved
    assert "boxes of the detected anchors" in smoke.check_output("out", "detection", ref, moved, tol)["failures"][0]
    assert "not a detection head" in smoke.check_output("out", "detection", ref[..., :4], ref[..., :4], tol)["failures"][0]


def test_ctc_output_is_judged_by_the_text_it_decodes_to():
    """A CTC recogniser's per-step softmax [N, T, classes]: a blank step's probabilities moving a lot (a max-error
    check failed PP-OCR's INT8 build on them) does not fail the build while the text and line confidence hold;
    a changed character or a line confidence moved past the tolerance does."""
    import numpy as np

    from edgekit.verify import output_checks

    smoke = output_checks()
    tol = {"max_rel_error": 0.15, "abs_floor": 0.01, "min_top1_agreement": 0.9}
    n, t, c = 20, 12, 6
    best = np.tile(np.array([0, 1, 1, 0, 2, 0, 0, 3, 3, 3, 0, 0]), (n, 1))  # decodes to (1, 2, 3)
    ref = np.full((n, t, c), 0.02)
    np.put_along_axis(ref, best[..., None], 0.9, axis=-1)
    got = ref.copy()
    got[:, 0, 0], got[:, 0, 5] = 0.5, 0.42  # a blank step nearly flips: 0.4 of the range, same decision
    r = smoke.check_output("probs", "ctc", ref, got, tol)
    assert r["passed"] and r["text_agreement"] == 1.0 and r["cer"] == 0.0, r["failures"]
    # judged per position with max error deciding, it failed (a class output's agreement holds: a warning only)
    assert not smoke.check_output("probs", "class", ref, got, {**tol, "max_error_decides": True})["passed"]
    wrong = ref.copy()
    wrong[:4, 4, 2], wrong[:4, 4, 4] = 0.02, 0.9  # 4 of 20 lines read another second character
    r = smoke.check_output("probs", "ctc", ref, wrong, tol)
    assert not r["passed"] and "80.0% of 20 samples" in r["failures"][0] and abs(r["cer"] - 4 / 60) < 1e-9
    unsure = ref.copy()
    unsure[:, [1, 2, 4, 7, 8, 9], :] = np.where(unsure[:, [1, 2, 4, 7, 8, 9], :] > 0.5, 0.55, 0.09)
    r = smoke.check_output("probs", "ctc", ref, unsure, tol)  # same text, every character 0.35 less sure
    assert not r["passed"] and "confidence moves by 0.350" in r["failures"][0]
    logits = np.log(ref)  # logits are decoded the same way (softmax first)
    assert smoke.check_output("probs", "ctc", logits, logits, tol)["text_agreement"] == 1.0
    assert "not a CTC output" in smoke.check_output("probs", "ctc", ref[:, 0], ref[:, 0], tol)["failures"][0]


def test_class_disagreements_on_near_ties_are_counted_and_named():
    """A flipped decision where float's own top-2 margin is under 1% of the range is a near-tie (any rounding may
    move it): the bar counts it as agreeing, and the failure says how many of the disagreements are such, so the
    user knows what kind of loss it is."""
    import numpy as np

    from edgekit.verify import output_checks

    smoke = output_checks()
    tol = {"max_rel_error": 1.0, "abs_floor": 0.0, "min_top1_agreement": 0.99}
    ref = np.array([[0.5, 0.495, 0.005], [0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.6, 0.3, 0.1]])
    got = ref.copy()
    got[0], got[1] = [0.49, 0.5, 0.01], [0.3, 0.6, 0.1]  # a near-tie flipped, and a clear decision flipped
    r = smoke.check_output("o", "class", ref, got, tol)
    assert (r["disagreements"], r["near_tie_disagreements"]) == (2, 1)
    assert "1 of the 2 disagreements are near-ties" in r["failures"][0]
    assert "agrees with float on 75.0% of 4" in r["failures"][0]  # the near-tie counted as agreeing, not 50%
    assert smoke.check_output("o", "class", ref, ref, tol)["disagreements"] == 0
    # only the near-tie flipped: the plain share is 75%, the bar (99%) passes, and the flip is still reported
    tie = ref.copy()
    tie[0] = [0.49, 0.5, 0.01]
    r = smoke.check_output("o", "class", ref, tie, tol)
    assert r["passed"] and r["top1_agreement"] == 0.75 and r["near_tie_disagreements"] == 1
    # a clear decision flipped by less (margin 0.02 of a 0.9 range is above 1%): a disagreement the bar counts
    close = ref.copy()
    close[0] = [0.5, 0.48, 0.02]
    bent = close.copy()
    bent[0] = [0.48, 0.5, 0.02]
    r = smoke.check_output("o", "class", close, bent, tol)
    assert not r["passed"] and r["near_tie_disagreements"] == 0


def test_eval_agreement_on_non_finite_outputs_is_a_note_not_a_traceback():
    """A converted model that gives NaN on the eval samples (no labels) has no top-1 or text agreement to report:
    verification says so in a note and fails on the golden samples; it raised KeyError before."""
    import numpy as np

    from edgekit.data import Dataset
    from edgekit.model import Model, TensorSpec
    from edgekit.profiles import load_target
    from edgekit.verify import verify

    tol = load_target("jetson").tolerances["int8"]
    model = Model("t", "onnx", "", [TensorSpec("x", (1, 4))], [TensorSpec("y", ())])
    ds = Dataset("t", {"x": np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)}, None)
    probs = np.array([[0.7, 0.2, 0.1]])
    for kind, shape in (("class", (3,)), ("ctc", (5, 3))):
        def ref(f, shape=shape):
            return [np.broadcast_to(probs.reshape((1,) * (len(shape) - 1) + (3,)), (len(f["x"]), *shape)).copy()]

        def nan(f, shape=shape):
            return [np.full((len(f["x"]), *shape), np.nan)]

        v, _, _ = verify(model, ref, nan, ds, 8, tol, "test", "int8", eval_data=ds, kinds={"y": kind})
        assert not v.passed and "non-finite" in v.failures[0]
        assert any("no agreement measured on the 20 eval samples" in n and "NaN" in n for n in v.notes), v.notes


def test_time_major_ctc_output_is_merged_on_its_batch_axis_host_and_board(digits, tmp_path):
    """A recogniser whose output is time-major [T, N, classes] (ddddocr's, torch's CTC layout): its runs are joined
    on the batch axis (1) and read [samples, T, classes], so the `ctc` kind decodes each line's text; before, the
    runs were stacked on axis 0 and every time step was read as a sample of one step. The manifest records the axis
    and the board's runner merges its own runs on it: the bundle passes there, and a changed golden line fails."""
    import shutil
    import subprocess
    import sys

    import numpy as np
    import torch

    from edgekit.fsutil import sha256_file
    from edgekit.pipeline import convert

    class TimeMajor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x):  # [1, 1, 8, 16] -> [16, 1, 5]
            f = torch.relu(self.conv(x)).mean(dim=2)  # [N, 8, W]
            return torch.log_softmax(self.fc(f.permute(2, 0, 1)), dim=-1)

    path = tmp_path / "tm.onnx"
    torch.onnx.export(TimeMajor().eval(), (torch.zeros(1, 1, 8, 16),), str(path), input_names=["line"],
                      output_names=["logits"], dynamo=False, opset_version=13)
    d = np.load(digits["calib"])
    imgs = next(v for v in d.values() if v.ndim == 4)[:80].astype(np.float32)  # real digits, two per "line"
    lines = np.concatenate([imgs[0::2], imgs[1::2]], axis=3)
    np.savez(tmp_path / "lines.npz", line=lines)
    res = convert(str(path), "jetson", tmp_path / "out", precision="fp32", calib=str(tmp_path / "lines.npz"),
                  output_kinds={"logits": "ctc"})
    man = json.loads((res.out_dir / "manifest.json").read_text())
    spec = man["golden"]["outputs"][0]
    assert spec["batch_axis"] == 1 and spec["shape"] == [16, 5] and spec["kind"] == "ctc"
    out = man["verification"]["outputs"][0]
    assert out["metrics"]["text_agreement"] == 1.0 and out["metrics"]["cer"] == 0.0
    golden = dict(np.load(res.out_dir / "golden.npz"))
    assert golden["output_0"].shape[:2] == (len(golden["input_0"]), 16)  # one line per sample
    bundle = tmp_path / "b"
    shutil.copytree(res.out_dir, bundle)

    def board():
        return subprocess.run([sys.executable, str(bundle / "run.py"), "--runtime", "onnxruntime", "--iters", "5",
                               "--warmup", "1"], capture_output=True, text=True, timeout=120)

    proc = board()
    assert proc.returncode == 0 and "PASS golden" in proc.stdout, proc.stdout + proc.stderr
    g = golden["output_0"]
    g[: len(g) // 2, 5:11] = np.roll(g[: len(g) // 2, 5:11], 1, axis=-1)  # half the lines read other characters
    np.savez(bundle / "golden.npz", **golden)
    man["files"]["golden.npz"]["sha256"] = sha256_file(bundle / "golden.npz")
    (bundle / "manifest.json").write_text(json.dumps(man))
    proc = board()
    assert proc.returncode == 1 and "FAIL golden" in proc.stdout, proc.stdout


def test_a_batch_axis_beyond_the_output_is_named():
    """The board merges its runs on the manifest's batch_axis: one that is not an axis of the output (a damaged or
    hand-edited manifest) is a one-line error naming it, not numpy's AxisError from deep inside the merge."""
    import numpy as np
    import pytest as _pytest

    from edgekit.verify import output_checks

    smoke = output_checks()
    parts = [[np.zeros((5, 1, 3))], [np.ones((5, 1, 3))]]
    merged, axes = smoke.merge_batches(parts, 1)
    assert axes == [1] and merged[0].shape == (2, 5, 3) and merged[0][1].min() == 1.0
    with _pytest.raises(ValueError, match="batch_axis 7 is not an axis of its 3-d output"):
        smoke.merge_batches(parts, 1, [7])


def test_an_agreement_bar_the_golden_samples_cannot_show_is_warned(digits, tmp_path):
    """--tolerance min_top1_agreement=0.99 on 64 golden samples: 64 of 64 agreeing shows only 94.3% (Wilson), so a
    build agreeing on 96% of inputs can pass. The convert says so and names the --golden that can show the bar
    (381); with 400 golden samples it is quiet, and so is the default 90% bar on 64."""
    from edgekit.pipeline import convert

    def warned(tol, n, name):
        said = []
        convert(digits["model"], "jetson", tmp_path / name, board="host", precision="fp32",
                eval_data=str(digits["eval"]), tolerance=tol, golden_count=n, cache=False, warn=said.append)
        return [w for w in said if "min_top1_agreement" in w]

    w = warned({"min_top1_agreement": 0.99}, 64, "a")
    assert len(w) == 1 and "shows only 94.3%" in w[0] and "--golden 381" in w[0], w
    assert warned({"min_top1_agreement": 0.99}, 400, "b") == []
    assert warned({"min_top1_agreement": 0.9}, 64, "c") == []


def _verify_arrays(ref_out, got_out, tol, kind, eval_ref=None, eval_got=None):
    """edgekit.verify.verify on fixed arrays: the 'float model' and the 'artifact' answer each golden (and eval)
    sample with its row of ``ref_out`` / ``got_out`` (``eval_*``: the eval samples' rows), the sample's index
    being its input."""
    import numpy as np

    from edgekit.data import Dataset
    from edgekit.model import Model, TensorSpec
    from edgekit.verify import verify

    n = len(ref_out)
    golden = Dataset("golden", {"x": np.arange(n, dtype=np.float32).reshape(n, 1)}, None)
    model = Model("t", "onnx", "", [TensorSpec("x", (1, 1))], [TensorSpec("y", ())])
    rows = {"ref": ref_out, "got": got_out}
    if eval_ref is not None:  # the eval samples' inputs are their indices offset by n
        rows = {"ref": np.concatenate([ref_out, eval_ref]), "got": np.concatenate([got_out, eval_got])}
        ev = Dataset("eval", {"x": np.arange(n, n + len(eval_ref), dtype=np.float32).reshape(-1, 1)}, None)
    else:
        ev = None

    def runner(which):
        return lambda f: [rows[which][f["x"][:, 0].astype(int)]]

    v, _, _ = verify(model, runner("ref"), runner("got"), golden, n, tol, "arrays", "int8", eval_data=ev,
                     kinds={"y": kind})
    return v


def test_a_classifier_whose_agreement_passes_is_not_failed_by_one_worst_sample():
    """Issue 46: MTCNN's P-Net at android INT8 agreed with float on every held-out crop (37.7 dB) and was failed by
    one sample's max error (20% of the range, tolerance 15%). Where the output's task metric is set and passes (here
    top-1 agreement on a class output, on the golden and the eval samples), the worst sample is a warning naming
    the sample and its error, and the build passes; the tolerance's max_error_decides makes it decide again, and
    where agreement fails on the eval samples the worst sample decides too."""
    import numpy as np

    from edgekit.profiles import load_target

    tol = load_target("android").tolerances["int8"]  # max_rel_error 0.15, min_top1_agreement 0.9
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(32, 10))
    ref[np.arange(32), rng.integers(0, 10, 32)] += 6.0  # a clear winner per sample
    got = ref + rng.normal(scale=0.01, size=ref.shape)
    scale = np.abs(ref).max()
    loser = int(np.argmin(ref[17]))
    got[17, loser] += 0.2 * scale  # one sample's losing class moves by 20% of the range: its decision holds
    v = _verify_arrays(ref, got, tol, "class")
    o = v.outputs[0]
    assert v.passed and o.passed and not v.failures, v.failures
    assert o.max_rel_error > 0.15 and o.top1_agreement == 1.0 and o.worst_sample == 17
    assert o.decided_by == ["top1_agreement"], o.decided_by
    (w,) = o.warnings
    assert f"max error {o.max_abs_error:.4g} is {o.max_rel_error:.2%} of the output range" in w, w
    assert "golden sample 17" in w and "reported, not deciding" in w, w
    assert "top-1 agreement 100.0% meets its bar (90%)" in w, w
    assert "warnings" in v.to_json()["outputs"][0]  # recorded in the manifest with the output
    # the tolerance says max error decides: the same outputs fail on it
    strict = _verify_arrays(ref, got, tol.model_copy(update={"max_error_decides": True}), "class")
    assert not strict.passed and "max error" in strict.failures[0] and "golden sample 17" in strict.failures[0]
    assert strict.outputs[0].decided_by == ["top1_agreement", "max_rel_error"] and not strict.outputs[0].warnings
    # eval samples on which agreement holds keep it a warning; eval samples on which it fails make it decide
    held = _verify_arrays(ref, got, tol, "class", eval_ref=ref, eval_got=ref + 0.001)
    assert held.passed and held.outputs[0].warnings, held.failures
    flipped = ref.copy()
    flipped[:8] = -flipped[:8]  # 8 of 32 eval samples decide otherwise: 75% agreement, needs 90%
    bad = _verify_arrays(ref, got, tol, "class", eval_ref=ref, eval_got=flipped)
    assert not bad.passed and not bad.outputs[0].passed and not bad.outputs[0].warnings
    assert "golden sample 17" in bad.failures[0] and "fails on the 32 eval samples" in bad.failures[0], bad.failures
    assert "max_rel_error" in bad.outputs[0].decided_by


def test_without_a_task_metric_max_error_still_decides():
    """A regression output is judged by SNR where the tolerance sets min_snr_db: a worst sample over max_rel_error
    is then a warning while the SNR passes, and a failure as well where the SNR fails. Where the tolerance sets no
    SNR bar, nothing else measures the output, and its max error decides alone."""
    import numpy as np

    from edgekit.profiles import load_target

    tol = load_target("jetson").tolerances["int8"]  # max_rel_error 0.15, min_snr_db 15
    rng = np.random.default_rng(1)
    ref = rng.uniform(-1, 1, size=(64, 4))
    got = ref + rng.normal(scale=0.01, size=ref.shape)
    got[5, 2] += 0.3  # one box coordinate of one sample moved by 30% of the range: SNR stays near 30 dB
    v = _verify_arrays(ref, got, tol, "regression")
    o = v.outputs[0]
    assert v.passed and o.metrics["snr_db"] > 15 and o.decided_by == ["snr_db"], (v.failures, o.metrics)
    assert len(o.warnings) == 1 and "golden sample 5" in o.warnings[0] and "SNR" in o.warnings[0]
    no_bar = _verify_arrays(ref, got, tol.model_copy(update={"min_snr_db": None}), "regression")
    assert not no_bar.passed and no_bar.outputs[0].decided_by == ["max_rel_error"]
    assert no_bar.failures[0].startswith("output 'y': max error") and "golden sample 5" in no_bar.failures[0]
    assert not no_bar.outputs[0].warnings
    high = _verify_arrays(ref, got, tol.model_copy(update={"min_snr_db": 60.0}), "regression")  # SNR fails too
    assert not high.passed and any("max error" in f for f in high.failures) and any("SNR" in f for f in high.failures)
    assert high.outputs[0].decided_by == ["snr_db", "max_rel_error"]
