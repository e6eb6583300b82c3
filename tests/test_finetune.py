"""`edgekit finetune`: distillation with INT8 fake quantization on the digits example (real torch, real data),
its way back into convert, checkpoints that resume exactly, AMP, and torchrun with 2 CPU processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgekit.errors import InputSpecError, OutputError  # noqa: E402
from edgekit.finetune import finetune  # noqa: E402
from edgekit.lineage import read_record  # noqa: E402

EPOCHS = 10


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """A model this small trains fastest on one thread; on a shared machine two threads wait on each other
    (measured 10x slower per epoch under load). torchrun sets OMP_NUM_THREADS=1 the same way."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tuned(digits, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "digits-ft.pt2"
    return finetune(digits["model"], digits["calib"], out, target="jetson", epochs=EPOCHS)


def _int8_vs_float(digits, model_path, out_dir):
    """Convert ``model_path`` to jetson INT8 (onnxruntime Q/DQ) and compare it with the ORIGINAL float model on
    the held-out eval split: top-1 agreement, accuracy, and KL(float || int8) of the class probabilities."""
    import onnxruntime as ort

    from edgekit.ingest import load_model
    from edgekit.pipeline import convert

    res = convert(str(model_path), target="jetson", out=out_dir, precision="int8", calib=str(digits["calib"]),
                  fail_on_verification=False)
    ev = np.load(digits["eval"])
    x, y = ev["image"], ev["label"]
    ref = load_model(digits["model"]).torch_module
    sess = ort.InferenceSession(str(res.out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        fl = np.concatenate([ref(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    q = np.concatenate([sess.run(None, {"image": x[i:i + 1]})[0] for i in range(len(x))])
    logp = lambda a: torch.log_softmax(torch.from_numpy(a).double(), 1)  # noqa: E731
    kl = float(torch.nn.functional.kl_div(logp(q), logp(fl), log_target=True, reduction="batchmean"))
    return {"agree": float(np.mean(q.argmax(1) == fl.argmax(1))), "acc": float(np.mean(q.argmax(1) == y)),
            "kl": kl, "n": len(x), "manifest": res.manifest, "verification": res.verification}


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_finetune_brings_int8_closer_to_float_after_convert(digits, tuned, tmp_path):
    """Plain PTQ of the float model vs PTQ of the fine-tuned weights, both through `convert --precision int8`,
    judged against the original float model on 450 held-out inputs. Measured: KL 1.7e-4 -> 0.9e-4, agreement
    99.78% -> 99.56..100% (one sample either way)."""
    assert tuned.loss_after < tuned.loss_before  # on the training inputs, fake-quant student vs float
    plain = _int8_vs_float(digits, digits["model"], tmp_path / "plain")
    ft = _int8_vs_float(digits, tuned.out, tmp_path / "ft")
    assert ft["kl"] < 0.8 * plain["kl"], (plain, ft)
    assert ft["agree"] >= plain["agree"] - 1.5 / plain["n"], (plain, ft)  # at most one held-out sample flips
    assert ft["agree"] >= 0.99
    # the build records where the weights came from
    assert ft["manifest"]["source_model"]["finetuned_from"]["sha256"] == tuned.record["finetuned_from"]["sha256"]
    # and is measured against that float model too; with no --eval its golden samples come from --calib, which is
    # what finetune trained on: convert says so
    against = ft["verification"].against_original
    assert against["from"] == "golden" and against["samples"] == 64 and against["trained_on"] == 64
    assert any("64 of the 64 golden samples were among the samples edgekit finetune trained on" in n
               for n in ft["verification"].notes)
    assert plain["verification"].against_original is None  # a model finetune did not write


def test_convert_measures_a_finetuned_model_against_its_original_float(digits, tuned, tmp_path):
    """A fine-tuned .pt2 is verified against its own float weights; convert also measures it against the float
    model it came from (found by the record's path and sha256) on the held-out --eval samples, none of which the
    fine-tuning saw. fp32 here: the build runs the fine-tuned weights, so its top-1 agreement with the original is
    that of the two float models, computed here in torch."""
    from edgekit.ingest import load_model
    from edgekit.pipeline import convert

    res = convert(str(tuned.out), target="jetson", out=tmp_path / "fp32", precision="fp32",
                  calib=str(digits["calib"]), eval_data=str(digits["eval"]), fail_on_verification=False)
    against = res.verification.against_original
    x = np.load(digits["eval"])["image"]
    orig, ft = load_model(digits["model"]).reference(), load_model(tuned.out).reference()
    orig, ft = (np.concatenate([r({"image": x[i:i + 1]})[0] for i in range(len(x))]) for r in (orig, ft))
    assert against["from"] == "eval" and against["samples"] == len(x) and against["trained_on"] == 0
    assert against["sha256"] == tuned.record["finetuned_from"]["sha256"]
    assert against["outputs"]["output"]["top1_agreement"] == pytest.approx(np.mean(orig.argmax(1) == ft.argmax(1)),
                                                                            abs=1.5 / len(x))
    assert any(n.startswith("against the float model it was fine-tuned from") for n in res.verification.notes)
    assert res.manifest["verification"]["against_original"]["samples"] == len(x)
    assert "- measured against the float model it was fine-tuned from" in (res.out_dir / "report.md").read_text()


def test_an_original_that_changed_or_went_is_named_not_measured(digits, tmp_path):
    """The record names the original by path and sha256: a file that changed since (or is gone) is not measured,
    and the note says which."""
    from edgekit.pipeline import convert

    orig = tmp_path / "orig.pt2"
    orig.write_bytes(digits["model"].read_bytes())
    tuned = finetune(str(orig), digits["calib"], tmp_path / "ft.pt2", target="jetson", epochs=1)
    with orig.open("ab") as fh:
        fh.write(b"\0")
    kw = dict(target="jetson", precision="fp32", calib=str(digits["calib"]), eval_data=str(digits["eval"]),
              fail_on_verification=False, cache=False)  # a cache hit would replay the first build's notes
    res = convert(str(tuned.out), out=tmp_path / "changed", **kw)
    assert res.verification.against_original is None
    assert any("changed since fine-tuning" in n for n in res.verification.notes), res.verification.notes
    orig.unlink()
    res = convert(str(tuned.out), out=tmp_path / "gone", **kw)
    assert any("is not there" in n for n in res.verification.notes), res.verification.notes


def test_output_is_a_pt2_with_its_recipe(tuned, digits):
    rec = read_record(tuned.out)
    assert rec["finetuned_from"]["path"] == str(digits["model"])
    assert rec["recipe"]["epochs"] == EPOCHS and rec["student"]["batch_norms_folded"] == 3
    assert rec["student"]["weight_layers"] == 4 and len(rec["activation_ranges"]) == rec["student"]["activation_points"]
    from edgekit.ingest import load_model

    m = load_model(tuned.out)  # edgekit's own ingest (archive checks) takes it
    assert [s.name for s in m.inputs] == ["image"] and m.outputs[0].shape == (1, 10)
    assert not any("fake_quant" in str(n.target) for n in m.exported.graph.nodes)
    assert not any("batch_norm" in str(n.target) for n in m.exported.graph.nodes)


def test_resume_continues_exactly(digits, tmp_path):
    """12 steps straight (checkpoints every 4) == resume from step 4 (mid-epoch: 6 steps per epoch) to 12."""
    kw = dict(epochs=2, checkpoint_every=4)
    straight = finetune(digits["model"], digits["calib"], tmp_path / "a.pt2", **kw)
    assert [p.name for p in straight.checkpoints] == ["step-0000004.pt", "step-0000008.pt", "step-0000012.pt"]
    resumed = finetune(digits["model"], digits["calib"], tmp_path / "b.pt2", resume=straight.checkpoints[0], **kw)
    assert resumed.steps == straight.steps == 12
    assert abs(resumed.loss_after - straight.loss_after) <= 1e-6 * straight.loss_after
    a = torch.load(straight.checkpoints[-1], weights_only=True)
    b = torch.load(resumed.checkpoints[-1], weights_only=True)
    for k, v in a["student"].items():
        torch.testing.assert_close(b["student"][k], v, rtol=1e-6, atol=1e-7)
    assert b["scheduler"]["last_epoch"] == a["scheduler"]["last_epoch"] == 12
    with pytest.raises(InputSpecError, match="other settings"):
        finetune(digits["model"], digits["calib"], tmp_path / "c.pt2", resume=straight.checkpoints[0], epochs=3)


def test_amp_bf16_runs_and_leaves_the_given_model_alone(digits, tmp_path):
    from edgekit.ingest import load_model

    m = load_model(digits["model"])
    before = {k: v.clone() for k, v in m.exported.state_dict.items()}
    res = finetune(m, digits["calib"], tmp_path / "amp.pt2", epochs=2, amp=True)
    assert res.amp == "bf16" and np.isfinite(res.loss_after) and res.loss_after < res.loss_before
    for k, v in m.exported.state_dict.items():  # the teacher was copied, not trained in place
        assert torch.equal(v, before[k]), k


def test_bad_input_is_refused_cleanly(digits, tmp_path):
    with pytest.raises(InputSpecError, match="jetson, android"):
        finetune(digits["model"], digits["calib"], tmp_path / "x.pt2", target="fpga")
    with pytest.raises(InputSpecError, match=r"\*\.pt2"):
        finetune(digits["model"], digits["calib"], tmp_path / "x.onnx")
    with pytest.raises(InputSpecError, match="choose auto, cpu or cuda"):
        finetune(digits["model"], digits["calib"], tmp_path / "x.pt2", device="gpu")
    with pytest.raises(InputSpecError, match="fewer than one batch"):
        finetune(digits["model"], digits["calib"], tmp_path / "x.pt2", batch_size=500)
    foreign = tmp_path / "mine.pt2"
    foreign.write_bytes(b"not edgekit's")
    with pytest.raises(OutputError, match="not a model edgekit finetune wrote"):
        finetune(digits["model"], digits["calib"], foreign)
    assert foreign.read_bytes() == b"not edgekit's"
    assert not list(tmp_path.glob("x.pt2*"))


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_torchrun_two_processes_match_one(digits, tmp_path):
    """`torchrun --nproc-per-node 2 -m edgekit finetune` (gloo, 2 CPU processes, 16 samples each per global batch
    of 32, the same data order) ends at the loss one process reaches, within 1e-4 relative (float sums in another
    order); measured about 1e-7."""
    args = [str(digits["model"]), "-d", str(digits["calib"]), "--epochs", "3", "--json"]
    one = finetune(digits["model"], digits["calib"], tmp_path / "one.pt2", epochs=3)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "edgekit", "finetune", *args, "-o", str(tmp_path / "two.pt2")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads(r.stdout)
    assert two["world_size"] == 2 and two["steps"] == one.steps == 18
    assert two["loss_before"] == pytest.approx(one.loss_before, rel=1e-6)
    assert two["loss_after"] == pytest.approx(one.loss_after, rel=1e-4)
    assert read_record(tmp_path / "two.pt2")["recipe"]["world_size"] == 2
    assert [p.name for p in (tmp_path / "two.pt2.ckpt").iterdir()] == ["step-0000018.pt"]  # rank 0 alone writes


def test_cli_folder_of_npy_android_with_features(digits, tmp_path):
    """The command itself: unlabeled inputs as a folder of .npy files, the android scheme, the feature loss."""
    from typer.testing import CliRunner

    from edgekit.cli import app

    folder = tmp_path / "inputs"
    folder.mkdir()
    x = np.load(digits["calib"])["image"]
    np.save(folder / "a.npy", x[:100])
    for i in range(100, 164):
        np.save(folder / f"s{i}.npy", x[i])  # one sample per file
    out = tmp_path / "ft.pt2"
    r = CliRunner().invoke(app, ["finetune", str(digits["model"]), "-d", str(folder), "-o", str(out), "-t", "android",
                                 "--epochs", "1", "--feature-weight", "1"])
    assert r.exit_code == 0, r.output
    assert "fine-tuned" in r.output and "distillation loss" in r.output
    rec = read_record(out)
    assert rec["recipe"]["samples"] == 164 and rec["recipe"]["feature_weight"] == 1.0
    assert "asymmetric" in rec["student"]["activations"] and rec["loss_after"] < rec["loss_before"]
    r = subprocess.run([sys.executable, "-m", "edgekit", "finetune", str(digits["model"]), "-d",
                        str(tmp_path / "none.npz"), "-o", str(tmp_path / "other.pt2")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "other.pt2").exists()
    r = subprocess.run([sys.executable, "-m", "edgekit", "finetune", str(digits["model"]), "-d", str(folder), "-o",
                        str(tmp_path / "b.pt2"), "--class-loss", "brier"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--class-loss brier: choose kl" in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "b.pt2").exists()


def test_fixed_batch_graph_and_regression_output(tmp_path):
    """A program exported at batch 1 with a reshape to it: where the reshape keeps the batch in front (a flatten
    before the classifier) it is rewritten to follow the batch, checked against one sample at a time, and whole
    batches train; where the batch is mixed in (a transpose first) the graph runs sample by sample inside each
    batch, with the same result. A one-column output is a regression output (MSE)."""
    from edgekit.fakequant import graph_module as _graph_module
    from edgekit.finetune.batching import batch_chunk as _batch_chunk
    from edgekit.finetune.batching import free_batch as _free_batch

    class Fixed(torch.nn.Module):
        def __init__(self, mixed: bool) -> None:
            super().__init__()
            self.mixed = mixed
            self.conv = torch.nn.Conv2d(1, 4, 3)
            self.fc = torch.nn.Linear(4 * 6 * 6, 1)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return self.fc((y.transpose(0, 1) if self.mixed else y).reshape(1, -1))

    x = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    results = {}
    for mixed in (False, True):
        torch.manual_seed(0)
        src = tmp_path / f"fixed-{mixed}.pt2"
        torch.export.save(torch.export.export(Fixed(mixed).eval(), (torch.zeros(1, 1, 8, 8),)), src)
        said: list[str] = []
        res = results[mixed] = finetune(str(src), x, tmp_path / f"out-{mixed}.pt2", epochs=2, batch_size=16,
                                        lr=1e-5, log=said.append)
        assert any(("fixed at batch 1" if mixed else "1 reshape(s) to it now follow the batch") in m for m in said)
        assert res.agreement_before is None and res.record["recipe"]["output_kinds"] == {"output": "regression"}
        assert res.loss_after < res.loss_before and res.steps == 8
    # the same weights and data: whole batches and one sample at a time give the same training
    assert results[False].loss_after == pytest.approx(results[True].loss_after, rel=0.02)

    from edgekit.ingest import load_model

    gm = _graph_module(load_model(tmp_path / "fixed-False.pt2"))
    xs = [torch.from_numpy(x[:8])]
    assert _batch_chunk(gm, xs) == 1 and _free_batch(gm) == 1 and _batch_chunk(gm, xs) is None
    gm = _graph_module(load_model(tmp_path / "fixed-True.pt2"))
    assert _free_batch(gm) == 0 and _batch_chunk(gm, xs) == 1  # [4, 1, 6, 6] -> [1, 144]: not rewritten


def test_probability_outputs_are_distilled_on_their_logs_per_position(digits, tmp_path):
    """A graph that ends in a softmax gives probabilities: the KL takes their logs, which is the KL of the logits
    behind them. (Softmaxing the probabilities again, /T, flattens them: on the confident digits CNN that loss
    is ~1e-6, and it rose 3x in training.) A [N, T, C] class output is one decision per position: the KL is
    over each row's C classes, not over the flattened T x C."""
    import plan_nets  # tests/support: the digits example as an nn.Module

    from edgekit.finetune.losses import distill_loss as _loss

    g = torch.Generator().manual_seed(0)
    zs, zt = torch.randn(8, 10, generator=g) * 3, torch.randn(8, 10, generator=g) * 3
    on_logits = float(_loss([zs], [zt], ["class"], 4.0))
    on_probs = float(_loss([zs.softmax(1)], [zt.softmax(1)], ["class-probabilities"], 4.0))
    assert on_probs == pytest.approx(on_logits, rel=1e-5)
    zs, zt = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    per_row = sum(float(_loss([zs[i, j:j + 1]], [zt[i, j:j + 1]], ["class"], 1.0)) for i in range(2) for j in range(5))
    assert float(_loss([zs], [zt], ["class"], 1.0)) == pytest.approx(per_row / 10, rel=1e-5)

    class Softmaxed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = plan_nets.digits()

        def forward(self, x):
            return torch.softmax(self.net(x), 1)

    src = tmp_path / "softmaxed.pt2"
    torch.export.save(torch.export.export(Softmaxed().eval(), (torch.zeros(1, 1, 8, 8),)), src)
    res = finetune(str(src), digits["calib"], tmp_path / "out.pt2", epochs=2)
    assert "(on the logs of the probabilities of output)" in res.record["recipe"]["loss"]
    assert res.record["recipe"]["output_kinds"] == {"output": "class"}
    assert res.loss_after < res.loss_before
    plain = finetune(digits["model"], digits["calib"], tmp_path / "plain.pt2", epochs=1)
    assert "probabilities" not in plain.record["recipe"]["loss"]  # logits stay logits


def test_class_loss_mse_weighs_the_near_ties(digits, tmp_path):
    """--class-loss mse: the squared difference of the probabilities (softmax of logits, or the outputs where a
    softmax ends the graph). Per row, its gradient carries p(1 - p): with the same logit error, a near-tie row
    pulls the student thousands of times harder than a confident row, where the KL at T=4 pulls both about alike.
    The choice is recorded, checked before any work, and the loss falls on the digits CNN (at a smaller lr)."""
    from edgekit.finetune.losses import distill_loss as _loss

    zs, zt = torch.tensor([[6.5, 0.0], [0.5, 0.0]]), torch.tensor([[6.0, 0.0], [0.0, 0.0]])  # confident, near tie
    on_logits = float(_loss([zs], [zt], ["class"], 4.0, class_loss="mse"))
    assert on_logits == pytest.approx(float(((zs.softmax(1) - zt.softmax(1)) ** 2).mean()), rel=1e-6)
    assert float(_loss([zs.softmax(1)], [zt.softmax(1)], ["class-probabilities"], 4.0, class_loss="mse")) == (
        pytest.approx(on_logits, rel=1e-6))

    def pull(class_loss: str) -> float:  # the near-tie row's gradient over the confident row's
        s = zs.clone().requires_grad_(True)
        _loss([s], [zt], ["class"], 4.0, class_loss=class_loss).backward()
        g = s.grad.abs().sum(1)
        return float(g[1] / g[0])

    assert pull("mse") > 1000 and pull("kl") < 3

    with pytest.raises(InputSpecError, match="--class-loss brier"):
        finetune(digits["model"], digits["calib"], tmp_path / "bad.pt2", class_loss="brier")
    assert not (tmp_path / "bad.pt2").exists()
    # the CNN agrees on every sample already, so the loss is ~1e-6 and Adam's first steps (about lr each) would
    # raise it at 1e-4 (measured: 1.7e-6 -> 7.5e-6 in 2 epochs); at 1e-5 it falls 2.4x
    res = finetune(digits["model"], digits["calib"], tmp_path / "mse.pt2", epochs=2, lr=1e-5, class_loss="mse")
    assert res.record["recipe"]["class_loss"] == "mse"
    assert res.record["recipe"]["loss"].startswith("MSE of the probabilities on class outputs")
    assert res.loss_after < res.loss_before


def test_onnx_model_through_the_bridge(digits, tmp_path):
    """An ONNX model is rebuilt in torch (onnx2torch, checked against onnxruntime) and fine-tuned like a .pt2."""
    from edgekit.ingest import load_model

    import plan_nets  # tests/support: the digits example as an nn.Module

    net = plan_nets.digits()
    onnx_path = tmp_path / "digits.onnx"
    torch.onnx.export(net, (torch.zeros(1, 1, 8, 8),), str(onnx_path), input_names=["image"], dynamo=False,
                      opset_version=13)
    res = finetune(str(onnx_path), digits["calib"], tmp_path / "from-onnx.pt2", epochs=2)
    assert res.loss_after < res.loss_before and res.agreement_after == 1.0
    assert res.record["student"]["weight_layers"] == 4
    assert load_model(res.out).outputs[0].shape == (1, 10)


def test_pruned_student_distilled_from_the_whole_float_model(digits, tmp_path):
    """--prune: the student loses a quarter of its channels (torch-pruning) and learns from the unpruned float model."""
    pytest.importorskip("torch_pruning")
    from edgekit.ingest import load_model

    res = finetune("plan_nets:digits", digits["calib"], tmp_path / "pruned.pt2", epochs=20, lr=3e-3, prune=0.25,
                   input_shape=["1,1,8,8"])
    pr = res.record["student"]["pruned"]
    assert pr["macs_after"] < 0.75 * pr["macs_before"] and pr["params_after"] < pr["params_before"]
    # measured: loss 6.1 -> 0.40, agreement with float on the 200 inputs 98% (the pruned copy starts far off)
    assert res.loss_after < 0.1 * res.loss_before and res.agreement_after >= 0.95, res
    small = load_model(res.out)
    assert sum(v.numel() for v in small.exported.state_dict.values()) < pr["params_before"]
    with pytest.raises(InputSpecError, match="one or the other"):
        finetune("plan_nets:digits", digits["calib"], tmp_path / "x.pt2", prune=0.25, feature_weight=1.0,
                 input_shape=["1,1,8,8"])


def test_a_crafted_record_reads_no_other_file_and_breaks_nothing(digits, tuned, tmp_path):
    """A .pt2 whose finetune record was rewritten by hand (a path to a file that is not a model, fingerprints of the
    wrong type, a sha256 that is a number): convert measures nothing against it, says why, and the build stands."""
    import zipfile

    from edgekit.lineage import RECORD
    from edgekit.pipeline import convert

    secret = tmp_path / "secret.txt"
    secret.write_text("not a model")
    crafted = tmp_path / "crafted.pt2"
    with zipfile.ZipFile(tuned.out) as src, zipfile.ZipFile(crafted, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("extra/" + RECORD):
                rec = json.loads(data)
                rec["finetuned_from"] = {"path": str(secret), "abspath": 7, "sha256": 12}
                rec["data_samples"] = 5
                data = json.dumps(rec).encode()
            dst.writestr(item, data)
    res = convert(str(crafted), target="jetson", out=tmp_path / "o", precision="fp32", calib=str(digits["calib"]),
                  eval_data=str(digits["eval"]), fail_on_verification=False, cache=False)
    assert res.verification.passed and res.verification.against_original is None
    assert any("not measured" in n and "secret.txt is not there (or not a .pt2" in n for n in res.verification.notes)


def test_holdout_keeps_samples_out_of_training_and_measures_them(digits, tmp_path):
    """--holdout 0.25: a quarter of the data never trains (its fingerprints are not in the record, so convert
    counts them as unseen); the student's agreement and loss on them are measured before and after."""
    from edgekit.cli import app
    from typer.testing import CliRunner

    n = len(np.load(digits["calib"])["image"])
    res = finetune(digits["model"], digits["calib"], tmp_path / "ft.pt2", target="jetson", epochs=2, holdout=0.25)
    held = res.holdout
    assert held["samples"] == round(n * 0.25) and res.record["recipe"]["samples"] == n - held["samples"]
    assert len(res.record["data_samples"]) == n - held["samples"]
    for k in ("agreement_before", "agreement_after", "float_weights_agreement_after"):
        assert 0.5 <= held[k] <= 1.0, held
    assert held["loss_before"] > 0 and held["loss_after"] > 0
    # the held-out samples are the ones convert finds unseen: checked on exactly them
    from edgekit.data import Dataset
    from edgekit.ingest import load_model
    from edgekit.lineage import sample_digests

    m = load_model(digits["model"])
    x = np.load(digits["calib"])["image"]
    digests = sample_digests(Dataset("all", {"image": x}, None), m)
    assert sum(d not in set(res.record["data_samples"]) for d in digests) == held["samples"]
    r = CliRunner().invoke(app, ["finetune", str(digits["model"]), "-d", str(digits["calib"]), "-o",
                                 str(tmp_path / "cli.pt2"), "--epochs", "1", "--holdout", "0.25"])
    assert r.exit_code == 0, r.output
    assert f"held out {held['samples']} samples: distillation loss" in r.output
    with pytest.raises(InputSpecError, match="--holdout 1"):
        finetune(digits["model"], digits["calib"], tmp_path / "bad.pt2", holdout=1)
    assert not (tmp_path / "bad.pt2").exists()


def test_holdout_line_calls_out_a_fall_in_agreement_or_a_rise_in_loss():
    """What --holdout prints: a held-out loss that rose, or a top-1 agreement that fell while the loss fell (ppocr-cls
    on 3800 lines: loss 0.0075 -> 0.0054, agreement 95.0% -> 93.5%), is called out; a gain is not."""
    from edgekit.finetune import holdout_line

    h = {"samples": 200, "loss_before": 0.0075, "loss_after": 0.0054, "agreement_before": 0.95,
         "agreement_after": 0.935, "float_weights_agreement_after": 0.95}
    assert "top-1 agreement fell (the loss did not rise) on samples it did not train on" in holdout_line(h)
    assert "worse on samples" in holdout_line({**h, "loss_after": 0.008})
    assert "--" not in holdout_line({**h, "agreement_after": 0.96})
    assert "--" not in holdout_line({**h, "agreement_before": None, "agreement_after": None})


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_jetson_convert_imposes_the_ranges_the_student_trained_with(digits, tuned, tmp_path):
    """The activation ranges the student trained with flow back: a jetson INT8 convert of the fine-tuned .pt2 finds
    the ONNX tensors that hold each fake-quant point's values and quantizes them at the student's scale
    (max |range| / 127), and checks the build against the float model the student imitated (the original), not
    the fine-tuned float weights. ``student_ranges=off`` (the default) calibrates them from --calib and checks
    against its own weights. (On ppocr-cls the imposed build agrees with the original on 97.0% of 1000 held-out
    lines, as the student itself does, against 96.2% recalibrated: docs/finetune.md.)"""
    import onnx
    from onnx import numpy_helper

    from edgekit.pipeline import convert

    student = sorted(max(-lo, hi) / 127 for lo, hi in tuned.record["activation_ranges"])
    for mode in ("on", "off"):
        res = convert(str(tuned.out), target="jetson", out=tmp_path / mode, precision="int8",
                      calib=str(digits["calib"]), options={"student_ranges": mode}, fail_on_verification=False,
                      cache=False)
        rec = res.manifest["artifact"]["quantization"]["student_ranges"]
        assert rec["applied"] is (mode == "on") and rec["chosen"] == "by --option", rec
        # the fifth point is the global pooling's input: torch exports that pooling as ReduceMean, which TensorRT's
        # Q/DQ placement leaves unquantized, so the build holds no such tensor to impose it on
        assert mode == "off" or (rec["points"] == len(student) == 5 and rec["matched"] == 4), rec
        proto = onnx.load(str(res.out_dir / "model.onnx"))
        inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        scales = [float(inits[n.input[1]]) for n in proto.graph.node
                  if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
        imposed = sum(any(abs(q - a) <= 1e-6 * a for a in student) for q in scales)
        v = res.verification
        if mode == "on":
            assert imposed == 4 == len(scales), (scales, student)
            assert v.passed and v.reference_model == str(digits["model"]), v
            assert any(n.startswith("checked against the float model it was fine-tuned from") for n in v.notes)
            assert "artifact vs the float model it was fine-tuned from" in (res.out_dir / "report.md").read_text()
        else:
            assert imposed < 4, (scales, student)  # convert's own calibration of the fine-tuned weights
            assert v.reference_model is None and res.manifest["verification"]["reference_model"] is None


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_learned_ranges_train_from_min_max_and_flow_into_the_build(digits, tuned, tmp_path):
    """``learn_ranges``: each activation scale starts at the min/max one and trains with the weights (LSQ). The
    record holds the learned grid (symmetric on jetson), and a jetson convert with ``student_ranges=on`` puts
    those scales, not calibrated ones, on the matched tensors."""
    import onnx
    from onnx import numpy_helper

    from edgekit.pipeline import convert

    res = finetune(digits["model"], digits["calib"], tmp_path / "lsq.pt2", target="jetson", epochs=EPOCHS,
                   learn_ranges=True)
    assert res.record["recipe"]["learn_ranges"] is True and "learned (LSQ)" in res.record["student"]["activations"]
    learned = [max(-lo, hi) / 127 for lo, hi in res.record["activation_ranges"]]
    held = [max(-lo, hi) / 127 for lo, hi in tuned.record["activation_ranges"]]  # same data and seed, held ranges
    assert all(lo == -hi for lo, hi in res.record["activation_ranges"])
    moved = [abs(a / b - 1) for a, b in zip(learned, held, strict=True)]
    assert max(moved) > 0.01, (learned, held)  # the scales trained ...
    assert res.loss_after < res.loss_before and res.agreement_after >= 0.99  # ... and the student still learns
    out = convert(str(res.out), target="jetson", out=tmp_path / "on", precision="int8", calib=str(digits["calib"]),
                  options={"student_ranges": "on"}, fail_on_verification=False, cache=False)
    proto = onnx.load(str(out.out_dir / "model.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    scales = [float(inits[n.input[1]]) for n in proto.graph.node
              if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    assert sum(any(abs(q - a) <= 1e-6 * a for a in learned) for q in scales) == 4 == len(scales), (scales, learned)
    assert out.verification.passed, out.verification


@pytest.mark.slow  # a long toolchain build: in the full run (pytest -m 'not zoo')
def test_crafted_student_ranges_are_refused_and_the_build_calibrates(digits, tuned, tmp_path):
    """A record whose activation ranges were rewritten (text, NaN, or more points than the program has) imposes
    nothing under ``student_ranges=on``: convert says why in the manifest, calibrates from --calib and checks
    against the model's own weights."""
    import zipfile

    from edgekit.lineage import RECORD
    from edgekit.pipeline import convert

    for i, bad in enumerate(([["a", 1.0]] * 5, [[float("nan"), 1.0]] * 5, [[-1.0, 1.0]] * 9)):
        crafted = tmp_path / f"crafted{i}.pt2"
        with zipfile.ZipFile(tuned.out) as src, zipfile.ZipFile(crafted, "w") as dst:
            for item in src.infolist():
                data = src.read(item.filename)
                if item.filename.endswith("extra/" + RECORD):
                    rec = json.loads(data)
                    rec["activation_ranges"] = bad
                    data = json.dumps(rec).encode()
                dst.writestr(item, data)
        res = convert(str(crafted), target="jetson", out=tmp_path / f"o{i}", precision="int8",
                      calib=str(digits["calib"]), options={"student_ranges": "on"}, fail_on_verification=False,
                      cache=False)
        rec = res.manifest["artifact"]["quantization"]["student_ranges"]
        assert rec["applied"] is False and ("no usable" in rec["reason"] or "the record 9" in rec["reason"]), rec
        assert res.verification.passed and res.verification.reference_model is None
