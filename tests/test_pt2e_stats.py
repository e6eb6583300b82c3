"""PT2E calibration statistics taken once per job (edgekit.converters.common.pt2e.calibrated): the min-max
observers' statistics from the histogram observers' running min / max, a full calibration continued from the
observer choice's first samples, a rebuild's from the build's; each gives the same fake-quant program as its own
calibration would."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("litert_torch")


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y)) + y
        return self.fc(y.mean(dim=(2, 3)))


class _Calib:
    source = "test"

    def __init__(self, x: np.ndarray) -> None:
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def batches(self, model, limit=None):
        n = len(self.x) if limit is None else min(limit, len(self.x))
        for i in range(n):
            yield {"x": self.x[i:i + 1]}


def _job(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    # a spread that grows over the file: later samples widen the ranges, so no early stop hides a difference
    x = (rng.standard_normal((n, 3, 12, 12)) * np.linspace(0.5, 3.0, n)[:, None, None, None]).astype(np.float32)
    m = SimpleNamespace(inputs=[SimpleNamespace(name="x")], batch=1)
    return SimpleNamespace(model=m, calib=_Calib(x), cache={}, log=lambda msg: None, options={})


def _module():
    torch.manual_seed(0)
    net = _Net().eval()
    return torch.export.export(net, (torch.zeros(1, 3, 12, 12),)).module()


def _quantizer(obs: str):
    from edgekit.converters.tflite.quantizer import pt2e_quantizer

    return pt2e_quantizer(False, obs)


def _out(conv, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return conv(torch.from_numpy(x)).numpy()


def test_minmax_from_histogram_and_continued_calibration_match_their_own():
    from edgekit.converters.common.pt2e import SEARCH_CALIB, calibrated

    module, probe = _module(), np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)
    sample = (torch.zeros(1, 3, 12, 12),)
    n = SEARCH_CALIB + 20  # under MIN_CALIB + CONVERGE_CHUNK: no early stop
    job = _job(n)
    calibrated(job, module, sample, "histogram", _quantizer, limit=SEARCH_CALIB)  # the observer choice's pass
    store = next(iter(job.cache["pt2e_stats"].values()))
    assert ("histogram", SEARCH_CALIB) in store
    mm, _, nb = calibrated(job, module, sample, "minmax", _quantizer, limit=SEARCH_CALIB)  # derived, not calibrated
    assert nb == SEARCH_CALIB
    fresh = _job(n)
    mm_own, _, _ = calibrated(fresh, module, sample, "minmax", _quantizer, limit=SEARCH_CALIB)
    np.testing.assert_array_equal(_out(mm, probe), _out(mm_own, probe))
    # the full calibration continues from the first SEARCH_CALIB samples' statistics
    full, _, nb = calibrated(job, module, sample, "histogram", _quantizer)
    assert nb == n
    full_own, _, _ = calibrated(_job(n), module, sample, "histogram", _quantizer)
    np.testing.assert_allclose(_out(full, probe), _out(full_own, probe), rtol=0, atol=1e-6)
    # a rebuild (another call of the same job and program) calibrates nothing: the build's statistics
    assert ("histogram", None) in store
    again, _, nb = calibrated(job, module, sample, "histogram", _quantizer)
    assert nb == n
    np.testing.assert_array_equal(_out(again, probe), _out(full, probe))


def test_full_calibration_stops_when_ranges_converge():
    from edgekit.converters.common.pt2e import CONVERGE_CHUNK, MIN_CALIB, calibrated

    rng = np.random.default_rng(2)
    x = rng.standard_normal((160, 3, 12, 12)).astype(np.float32)
    x[: MIN_CALIB // 2] *= 4.0  # the widest inputs first: later ones move no range
    job = _job(1)
    job.calib = _Calib(x)
    _, _, nb = calibrated(job, _module(), (torch.zeros(1, 3, 12, 12),), "minmax", _quantizer)
    assert MIN_CALIB <= nb < 160 and (nb - MIN_CALIB) % CONVERGE_CHUNK == 0


def test_fused_fake_quant_program_gives_the_same_values():
    """torch_run's fast form of a fake-quant program (activation quantize -> dequantize as one fused op, the weights'
    computed once) gives the values of convert_pt2e's program."""
    from edgekit.converters.common.pt2e import calibrated, fused_fake_quant

    job = _job(16)
    module = _module()
    conv, _, _ = calibrated(job, module, (torch.zeros(1, 3, 12, 12),), "histogram", _quantizer)
    fast = fused_fake_quant(conv)
    assert fast is not conv and fused_fake_quant(conv) is fast
    names = {str(n.target) for n in fast.graph.nodes}
    assert not any("quantized_decomposed" in t for t in names) and any("fake_quantize_per_tensor" in t for t in names)
    for x in np.random.default_rng(3).standard_normal((4, 1, 3, 12, 12)).astype(np.float32) * 2:
        np.testing.assert_allclose(_out(fast, x), _out(conv, x), rtol=0, atol=1e-6)
    assert fused_fake_quant(module) is module  # a float program runs as it is


def test_a_rebuild_takes_the_first_builds_observer_without_calibrating(monkeypatch):
    """The observer choice calibrates every observer once per job: a rebuild of the same job (a float group, a kept
    set the search did not measure) takes the first build's choice and its measures, and says so."""
    import contextlib

    from edgekit.converters.common import pt2e

    job = _job(40)
    said: list[str] = []
    job.log = said.append
    job.substep = lambda name: contextlib.nullcontext()
    monkeypatch.setattr(pt2e, "search_feeds", lambda j: list(j.calib.batches(j.model))[:16])
    calls: list[str] = []
    real = pt2e.calibrated
    monkeypatch.setattr(pt2e, "calibrated",
                        lambda j, mod, s, obs, *a, **k: calls.append(obs) or real(j, mod, s, obs, *a, **k))
    module, sample = _module(), (torch.zeros(1, 3, 12, 12),)
    first = pt2e.choose_observer(job, module, sample, _quantizer)
    assert sorted(calls) == sorted(pt2e.OBSERVERS) and set(first[1]) == set(pt2e.OBSERVERS)
    calls.clear()
    assert pt2e.choose_observer(job, module, sample, _quantizer) == first and calls == []
    assert said[-1] == f"activation observer: {first[0]}, as this job's first build measured it"
    job.options = {"calibration": "minmax"}  # the user's choice still wins
    assert pt2e.choose_observer(job, module, sample, _quantizer) == ("minmax", {})


class _Concat(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(3, 8, 1)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        z = torch.relu(self.c2(y)) + y
        return self.fc(torch.cat([z, self.c3(x)], dim=1).mean(dim=(2, 3)))


def test_a_kept_layer_that_moves_a_few_observers_calibrates_only_those(monkeypatch):
    """A search build keeping a layer float: where that changes what a few observers watch (a ReLU kept float
    splits the spec it shared with its convolution), the other observers' statistics are copied from the build's
    calibration and only those few are calibrated, on the same samples; the program is the one its own
    calibration gives. Where every observer matches, nothing is calibrated."""
    from edgekit.converters.common import pt2e

    torch.manual_seed(0)
    module = torch.export.export(_Concat().eval(), (torch.zeros(1, 3, 12, 12),)).module()
    sample, probe = (torch.zeros(1, 3, 12, 12),), np.random.default_rng(1).standard_normal((1, 3, 12, 12))
    probe = probe.astype(np.float32)
    partial: list[int] = []
    real = pt2e._only_observing
    monkeypatch.setattr(pt2e, "_only_observing", lambda p, left: partial.append(len(left)) or real(p, left))
    job = _job(40)
    pt2e.calibrated(job, module, sample, "histogram", _quantizer, limit=pt2e.SEARCH_CALIB)
    for keep in ("relu", "conv2d_2", "cat"):
        partial.clear()

        def q(obs, keep=keep):
            from edgekit.converters.tflite.quantizer import pt2e_quantizer

            return pt2e_quantizer(False, obs, (keep,))

        got, _, nb = pt2e.calibrated(job, module, sample, "histogram", q, limit=pt2e.SEARCH_CALIB)
        own, _, _ = pt2e.calibrated(_job(40), module, sample, "histogram", q, limit=pt2e.SEARCH_CALIB)
        assert nb == 40 and partial == ([1] if keep == "relu" else []), (keep, partial)
        np.testing.assert_array_equal(_out(got, probe), _out(own, probe))


def test_a_histograms_range_is_searched_once_and_never_reused_for_other_statistics():
    """histogram_ranges_once: the same statistics give the range torchao's own search gives, searched once; other
    statistics get their own."""
    from edgekit.converters.common import pt2e
    from edgekit.converters.common.pt2e import histogram_ranges_once
    from torchao.quantization.pt2e.observer import HistogramObserver

    calls: list[int] = []
    search = HistogramObserver._non_linear_param_search

    def obs(scale: float):
        o = HistogramObserver(dtype=torch.qint8, qscheme=torch.per_tensor_affine)
        o(torch.from_numpy(np.random.default_rng(0).standard_normal(4096).astype(np.float32) * scale))
        return o

    plain = [obs(s).calculate_qparams() for s in (1.0, 3.0)]
    pt2e._RANGES.clear()
    HistogramObserver._non_linear_param_search = lambda self: calls.append(1) or search(self)
    try:
        with histogram_ranges_once():
            once = [obs(s).calculate_qparams() for s in (1.0, 3.0, 1.0, 3.0)]
    finally:
        HistogramObserver._non_linear_param_search = search
    for (s, z), (s1, z1) in zip(plain + plain, once, strict=True):
        assert float(s) == float(s1) and int(z) == int(z1)
    assert float(plain[0][0]) != float(plain[1][0]) and len(calls) == 2, calls


def test_an_observer_whose_build_litert_torch_cannot_lower_gives_way_to_the_next(tmp_path, monkeypatch):
    """litert-torch fails to lower some programs by their ranges alone (MTCNN's R-Net with min-max ranges:
    "MLIRError: Unable to parse type"; with the histogram observer's it lowers). The observer measured best is
    tried first; where its build does not lower, the next one measured is built, and the record says why. The
    first lowering's failure here is a stand-in (monkeypatched); the second lowering and the build are real."""
    from edgekit.converters.common import pt2e
    from edgekit.converters.tflite import build

    from edgekit.pipeline import convert

    torch.manual_seed(0)
    path = tmp_path / "mlp.onnx"
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    torch.onnx.export(net, (torch.zeros(1, 16),), str(path), input_names=["x"], output_names=["score"],
                      opset_version=13, dynamo=False)
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).normal(size=(300, 16)).astype(np.float32))
    real_choose, real_lower = build.choose_observer, build.lower
    lowered: list[int] = []

    def choose(job, module, sample, quantizer_for):
        _, measured = real_choose(job, module, sample, quantizer_for)
        return "minmax", {**measured, "minmax": max(measured.values()) + 1.0}  # min-max measured best

    def lower(lt, module, sample, layout, quant_config, m):
        if quant_config is None:  # the float program's lowering, checked before calibration
            return real_lower(lt, module, sample, layout, quant_config, m)
        lowered.append(1)
        if len(lowered) == 1:
            raise build.ConversionError("mlp.onnx: litert-torch could not convert the model (MLIRError: Unable "
                                        "to parse type:)")
        return real_lower(lt, module, sample, layout, quant_config, m)

    monkeypatch.setattr(build, "choose_observer", choose)
    monkeypatch.setattr(build, "lower", lower)
    assert pt2e.OBSERVERS == ("histogram", "minmax")
    res = convert(str(path), "android", tmp_path / "int8", precision="int8", calib=str(tmp_path / "calib.npz"),
                  output_kinds={"score": "regression"})
    q = res.manifest["artifact"]["quantization"]
    assert len(lowered) == 2 and q["calibration_method"] == "histogram", q
    assert "the minmax observer's build, measured best, did not lower (litert-torch could not convert the model " \
        "(MLIRError" in q["calibration_chosen"], q
    assert res.verification.passed, res.verification.failures


def test_the_layer_search_does_not_measure_an_observer_whose_build_did_not_lower(tmp_path, monkeypatch):
    """The first build records the observer whose build litert-torch could not lower; the layer search's kept sets
    are then calibrated with the other observer only (a kept set calibrated with it would not lower either, and
    the fallback would drop a layer as "does not convert" for a reason that is not the layer's). The first
    lowering's failure is a stand-in; the calibrations and the search's fake-quant programs are real."""
    from edgekit.converters import ConvertJob
    from edgekit.converters.tflite import build, search
    from edgekit.converters.tflite.converter import CONVERTER

    from edgekit.data import random_dataset
    from edgekit.ingest import load_model
    from edgekit.profiles import default_board, load_target

    torch.manual_seed(0)
    path = tmp_path / "mlp.pt2"
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                              torch.nn.Linear(32, 4)).eval()
    torch.export.save(torch.export.export(net, (torch.zeros(1, 16),)), str(path))
    real_choose, real_lower, real_calibrated = build.choose_observer, build.lower, search.calibrated
    lowered: list[int] = []

    def choose(job, module, sample, quantizer_for):
        _, measured = real_choose(job, module, sample, quantizer_for)
        return "minmax", {**measured, "minmax": max(measured.values()) + 1.0}

    def lower(lt, module, sample, layout, quant_config, m):
        if quant_config is not None:
            lowered.append(1)
            if len(lowered) == 1:
                raise build.ConversionError("mlp.pt2: litert-torch could not convert the model (MLIRError)")
        return real_lower(lt, module, sample, layout, quant_config, m)

    asked: list[str] = []

    def calibrated(job, module, sample, observer, *a, **k):
        asked.append(observer)
        return real_calibrated(job, module, sample, observer, *a, **k)

    monkeypatch.setattr(build, "choose_observer", choose)
    monkeypatch.setattr(build, "lower", lower)
    monkeypatch.setattr(search, "calibrated", calibrated)
    m = load_model(str(path))
    (tmp_path / "job").mkdir()
    job = ConvertJob(model=m, target=load_target("android"), board=default_board("android"), precision="int8",
                     calib=random_dataset(m, n=32), out_dir=tmp_path / "job", work_dir=tmp_path, log=lambda s: None,
                     warn=lambda s: None)
    artifact = CONVERTER.convert(job)
    assert artifact.meta["quantization"]["calibration_not_lowered"] == ["minmax"]
    s = CONVERTER.mixed_search(job, artifact)
    names = [lay.name for lay in s.layers][:2]
    assert len(names) == 2, s.layers
    asked.clear()
    s.outputs(names)  # a kept set of two: every observer not refused is measured
    assert asked == ["histogram"] and s.calibration_for(names) == "histogram", asked


class _BnAfterRelu(torch.nn.Module):
    """A BatchNorm after a ReLU: no convolution before it absorbs it, so the program keeps a BatchNorm node."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.c2(self.bn(torch.relu(self.c1(x))))


def test_a_ptq_program_is_converted_without_tracing_torchaos_qat_conv_bn_patterns(monkeypatch):
    """torchao's convert_pt2e traces its QAT conv-BatchNorm patterns with torch.export wherever a BatchNorm node is
    left (about 50 s per conversion of openWakeWord's embedding model); a program prepared for PTQ holds none of
    them. edgekit's conversion skips the tracing and gives the same program (the same outputs, bit for bit)."""
    import copy

    from edgekit.converters.common.pt2e import ptq_convert
    from edgekit.converters.coreml.w8a8 import w8a8_quantizer
    from torchao.quantization.pt2e import qat_utils, quantize_pt2e

    torch.manual_seed(0)
    net = _BnAfterRelu().eval()
    with torch.no_grad():  # running statistics of its own, so the BatchNorm is not the identity
        net.bn.running_mean.uniform_(0.2, 1.0)
        net.bn.running_var.uniform_(0.5, 2.0)
    module = torch.export.export(net, (torch.zeros(1, 3, 12, 12),)).module()
    prepared = quantize_pt2e.prepare_pt2e(module, w8a8_quantizer("histogram"))
    x = np.random.default_rng(0).standard_normal((16, 3, 12, 12)).astype(np.float32)
    with torch.no_grad():
        for i in range(16):
            prepared(torch.from_numpy(x[i:i + 1]))
    assert any("batch_norm" in str(n.target) for n in prepared.graph.nodes)
    traced: list[int] = []
    real = qat_utils._get_aten_graph_module_for_pattern

    def counted(*a, **k):
        traced.append(1)
        return real(*a, **k)

    monkeypatch.setattr(qat_utils, "_get_aten_graph_module_for_pattern", counted)
    plain = quantize_pt2e.convert_pt2e(copy.deepcopy(prepared))
    n_plain = len(traced)
    with ptq_convert():
        fast = quantize_pt2e.convert_pt2e(copy.deepcopy(prepared))
    assert n_plain > 0 and len(traced) == n_plain, (n_plain, len(traced))  # none traced under ptq_convert
    with torch.no_grad():
        for i in range(4):
            xi = torch.from_numpy(x[i:i + 1])
            np.testing.assert_array_equal(fast(xi).numpy(), plain(xi).numpy())


def test_ptq_convert_works_with_a_torchao_that_has_no_qat_folding_step(monkeypatch):
    """The step ptq_convert skips is torchao's private ``_fold_conv_bn_qat`` and torchao is not pinned: a release
    without it leaves nothing to skip, and the conversion goes on rather than failing with AttributeError."""
    from edgekit.converters.common.pt2e import ptq_convert
    from torchao.quantization.pt2e import quantize_pt2e

    monkeypatch.delattr(quantize_pt2e, "_fold_conv_bn_qat")
    with ptq_convert():
        assert not hasattr(quantize_pt2e, "_fold_conv_bn_qat")
    assert not hasattr(quantize_pt2e, "_fold_conv_bn_qat")
