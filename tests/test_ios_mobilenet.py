"""A MobileNetV2-shaped network (width 0.5, 32x32 input) through the Core ML converter.

Random weights with settled BatchNorm statistics: classifier outputs of such a net are
nearly input-independent, so top-1 agreement means nothing here (the digits tests cover
accuracy); this test checks spec, I/O, op list, weight bytes and the relative output error.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("coremltools", reason="the ios extra is not installed: pip install 'edgekit[ios]'")

import ios_mobilenet  # noqa: E402

# compressed-tensor bytes relative to fp32 and max relative output error, per precision
EXPECT = {"fp16": (None, 5e-3), "int8-weight": ((0.25, 0.28), 2e-2), "int4-weight": ((0.125, 0.14), 0.2)}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from edgekit.ingest import load_model

    path = tmp_path_factory.mktemp("mnv2") / "mnv2.pt2"
    ios_mobilenet.export(path, width=0.5)
    return load_model(path)


@pytest.mark.parametrize("precision", list(EXPECT))
def test_mobilenetv2_shaped(model, precision, tmp_path):
    from edgekit.converters import ConvertJob
    from edgekit.converters.coreml.converter import CONVERTER
    from edgekit.profiles import load_board, load_target

    (tmp_path / "out").mkdir()
    job = ConvertJob(model=model, target=load_target("ios"), board=load_board("apple/ipad-pro-m4"),
                     precision=precision, calib=None, out_dir=tmp_path / "out", work_dir=tmp_path,
                     log=lambda m: None, warn=lambda m: None)
    art = CONVERTER.convert(job)
    checks = art.meta["linux_checks"]
    assert checks["io"]["inputs"] == [{"name": "image", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert checks["io"]["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32"}]
    ops = checks["op_counts"]
    assert ops["conv"] == 52 and ops["linear"] == 1 and ops["clip"] >= 35  # ReLU6 -> clip
    assert "batch_norm" not in ops  # folded into the convs
    w = checks["weights"]
    assert w["weight_tensors"] == 53
    ratio, max_rel = EXPECT[precision]
    if ratio:
        assert ratio[0] <= w["compressed_ratio_vs_fp32"] <= ratio[1], w
        assert w["compressed_tensors"] >= 25
    else:
        assert 0.5 <= w["file_ratio_vs_fp32_weights"] <= 0.53
    assert checks["ane_flags"] == []
    # numeric: the package's program (compressed weights read back) against the torch model
    run = CONVERTER.host_runner(job, art)
    ref = model.reference()
    rng = np.random.default_rng(0)
    errs = []
    for _ in range(4):
        x = {"image": rng.random((1, 3, 32, 32), dtype=np.float32)}
        r, g = ref(x)[0], run(x)[0]
        errs.append(np.max(np.abs(g - r)) / np.max(np.abs(r)))
    assert max(errs) <= max_rel, (precision, errs)
