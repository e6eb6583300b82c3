"""Sensitivity scores cached per model and calibration data (edgekit.mixed.scores), on the real toolchain: the
fragile digits network's INT8 builds through torch.export -> ONNX -> onnxruntime's quantizer -> onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

from edgekit.pipeline import convert

sys.path.insert(0, str(Path(__file__).parent / "support"))  # plan_nets:digits_int8_fragile

FRAGILE, SHAPE = "plan_nets:digits_int8_fragile", ["1,1,8,8"]


def test_a_second_build_reuses_the_sensitivity_scores_until_the_calibration_data_changes(digits, tmp_path,
                                                                                       monkeypatch):
    """Sensitivity scores cached per model and calibration data (edgekit.mixed.scores): the fragile digits network
    built INT8 for one Jetson board searches its layers; built again for another Jetson board, the search reuses
    the scores (says so, sets up no search and builds no kept set: the counters around the real converter's search
    stay still) and keeps the same layer, verified for real. Other calibration data is another key: searched again.
    --no-cache neither reads nor writes the scores. The real toolchain throughout; the counters only count."""
    import re

    import numpy as np
    from edgekit.converters.tensorrt.converter import TensorRTConverter

    from edgekit import cache

    calls = {"search": 0, "builds": 0}
    real = TensorRTConverter.mixed_search

    def counted(self, job, artifact):
        calls["search"] += 1
        search = real(self, job, artifact)
        outputs = search.outputs

        def build(kept):
            calls["builds"] += 1
            return outputs(kept)

        search.outputs = build
        return search

    monkeypatch.setattr(TensorRTConverter, "mixed_search", counted)
    root = tmp_path / "cache"

    def build(board, calib, out, **kw):
        logs = []
        res = convert(FRAGILE, target="jetson", board=board, precision="int8", input_shape=SHAPE, calib=str(calib),
                      eval_data=str(digits["eval"]), out=tmp_path / out, cache_dir=root, log=logs.append, **kw)
        assert res.verification.passed
        assert [k["name"] for k in res.manifest["artifact"]["mixed_precision"]["kept"]] == ["node_linear"]
        return res, logs

    def reused(logs):
        return [m for m in logs if m.startswith("sensitivity scores from cache")]

    res, logs = build("nvidia/jetson-orin-nano-8gb", digits["calib"], "nano")
    first = dict(calls)
    assert first["search"] == 1 and first["builds"] >= 1 and not reused(logs)
    assert res.manifest["artifact"]["mixed_precision"]["stopped"] == "answer found"
    assert any(m.startswith("layer search: ") and m.endswith("stopped: answer found") for m in logs), logs
    assert [e.kind for e in cache.entries(root)].count("sensitivity") == 1

    res, logs = build("nvidia/jetson-orin-nx-16gb", digits["calib"], "nx")
    assert calls == first, calls  # neither the search's set-up nor any kept set built again
    assert len(reused(logs)) == 1 and re.fullmatch(r"sensitivity scores from cache \(1 layer, saved \d+\.\d s\)",
                                                   reused(logs)[0]), logs
    mp = res.manifest["artifact"]["mixed_precision"]
    assert mp["builds"] == 0 and mp["scores_from_cache"]["layers"] == 1 and mp["search_samples"] == 32
    assert "from the cache" in (res.out_dir / "report.md").read_text()

    other = tmp_path / "calib-other.npz"  # the same kind of data, fewer samples: other scores
    with np.load(digits["calib"]) as d:
        np.savez(other, **{k: v[:-20] for k, v in d.items()})
    res, logs = build("nvidia/jetson-orin-nx-16gb", other, "other")
    assert calls["search"] == 2 and calls["builds"] > first["builds"] and not reused(logs)
    assert [e.kind for e in cache.entries(root)].count("sensitivity") == 2

    res, logs = build("nvidia/jetson-orin-nx-16gb", digits["calib"], "off", cache=False)
    assert calls["search"] == 3 and not reused(logs)  # --no-cache: not read ...
    assert [e.kind for e in cache.entries(root)].count("sensitivity") == 2  # ... nor written

