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
    from edgekit.converters import tensorrt
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
