"""The simulated INT8 graph of the jetson build (converters/tensorrt/simulate.py): one onnxruntime session whose
graph inputs switch each node's Q/DQ rounding on or off and set each activation's scale computes what the real
Q/DQ models quantize_static writes compute, for every kept set and every calibration method. Real toolchains:
torch.export -> ONNX -> onnxruntime's quantizer -> onnxruntime."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from edgekit.pipeline import convert


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small conv net with two convolutions reading one tensor and a linear head (Conv, Conv, Conv, Gemm), its
    preprocessed float graph, calibration and search feeds, and every calibration method's ranges."""
    import onnx
    import torch

    from edgekit.converters.tensorrt.calibration import CALIBRATIONS, calibrated_ranges
    from edgekit.converters.tensorrt.qdq import TRT_QDQ_OPS, preprocessed

    tmp = tmp_path_factory.mktemp("sim")
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.a, self.b = torch.nn.Conv2d(1, 6, 3, padding=1), torch.nn.Conv2d(6, 4, 3), torch.nn.Conv2d(6, 4, 3)
            self.fc = torch.nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            y = torch.relu(self.c1(x))  # read by two convolutions: one Q/DQ pair for both in a real build
            return self.fc(torch.flatten(torch.relu(self.a(y)) - torch.relu(self.b(y)), 1))

    torch.manual_seed(0)
    net = Net().eval()
    x = np.random.default_rng(0).normal(0, 1, (48, 1, 8, 8)).astype(np.float32)
    torch.export.save(torch.export.export(net, (torch.from_numpy(x[:1]),)), str(tmp / "net.pt2"))
    fp32 = convert(str(tmp / "net.pt2"), target="jetson", precision="fp32", out=tmp / "fp32")
    job = SimpleNamespace(work_dir=tmp, options={})
    pre = preprocessed(job, fp32.out_dir / "model.onnx")
    name = onnx.load(str(pre)).graph.input[0].name
    feeds = [{name: x[i:i + 1]} for i in range(32)]
    search = [{name: x[i:i + 1]} for i in range(32, 48)]
    histograms: dict = {}
    ranges = {m: calibrated_ranges(job, pre, feeds, m, histograms) for m in CALIBRATIONS}
    nodes = [n.name for n in onnx.load(str(pre)).graph.node if n.op_type in TRT_QDQ_OPS]
    return SimpleNamespace(tmp=tmp, job=job, pre=pre, search=search, ranges=ranges, nodes=nodes)


def _close(a: list[np.ndarray], b: list[np.ndarray], what: str, ref: list[np.ndarray], db: float = 0.5) -> None:
    """The output SNR against float ``ref`` of the simulated ``a`` and the real ``b`` within ``db``: onnxruntime
    optimizes the real Q/DQ model (fusions, integer kernels) otherwise than the simulated graph, whose Where nodes
    and scale inputs stop them; a value on an int8 rounding boundary then rounds the other way, which moves that
    sample's output downstream (a few of 16 samples here; on the zoo, see the build's simulated_vs_real)."""
    from edgekit.mixed.search import output_snr_db

    sa, sb = output_snr_db(ref, a), output_snr_db(ref, b)
    assert sa == sb or abs(sa - sb) < db, (what, sa, sb)


def _unoptimized(path, feeds: list[dict], extra: dict | None = None) -> list[np.ndarray]:
    """``path``'s outputs with onnxruntime's graph optimizations off: the graph as written, op by op."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return [np.concatenate(o) for o in zip(*(sess.run(None, {**f, **(extra or {})}) for f in feeds), strict=True)]


def _same(a: list[np.ndarray], b: list[np.ndarray], what: str) -> None:
    for x, y in zip(a, b, strict=True):
        assert np.allclose(x, y, rtol=1e-5, atol=1e-6), (what, float(np.max(np.abs(x - y))))


def test_switching_nodes_equals_real_qdq_builds_with_the_others_excluded(small):
    """Only node n switched on = quantize_static with every other node excluded; every node but n switched on =
    n excluded (the search's kept set: a kept convolution still reads the Q/DQ pair of an input that the other
    reader's quantization wants, as quantize_static writes it); nothing switched on = the float model; one
    session for all of them."""
    from edgekit.converters.tensorrt.qdq import run_model, write_qdq
    from edgekit.converters.tensorrt.simulate import method_ranges, simulation

    s = small
    assert len(s.nodes) == 4, s.nodes
    sim = simulation(s.job, s.pre, s.ranges["minmax"], "minmax", [], "tensorrt")
    sim.use_scales(method_ranges(s.ranges["minmax"]))
    assert sorted(sim.nodes) == sorted(s.nodes)
    import onnx

    graph = onnx.load(str(sim.path)).graph  # a switched-off pair computes nothing: its Q/DQ run inside an If
    assert not any(n.op_type in ("Where", "QuantizeLinear") for n in graph.node), [n.op_type for n in graph.node]
    session = sim.model.sess
    ref = run_model(s.pre, s.search)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(sim.float_outputs(s.search), ref, strict=True))
    real = s.tmp / "real.onnx"
    for n in s.nodes:
        for on in ([n], [m for m in s.nodes if m != n]):
            write_qdq(s.pre, real, s.ranges["minmax"], "minmax", [m for m in s.nodes if m not in on], "tensorrt")
            # op by op, the simulated graph is the real Q/DQ model, within float tolerance
            _same(_unoptimized(sim.path, s.search, sim.inputs(on)), _unoptimized(real, s.search), f"{on} on")
            # in the sessions the build runs (graph optimizations on), the same output SNR
            _close(sim.run(s.search, quantized=on), run_model(real, s.search), f"{on} on", ref)
    assert sim.model.sess is session and sim.runs == 1 + 2 * len(s.nodes)


def test_each_calibration_methods_scales_fed_equal_its_real_qdq_model(small):
    """The graph written from min-max ranges, fed another method's scales, computes that method's Q/DQ model."""
    from edgekit.converters.tensorrt.qdq import run_model, write_qdq
    from edgekit.converters.tensorrt.simulate import method_ranges, simulation

    s = small
    sim = simulation(s.job, s.pre, s.ranges["minmax"], "minmax", [], "tensorrt")
    real = s.tmp / "method.onnx"
    ref = run_model(s.pre, s.search)
    snr = {}
    for m, path in s.ranges.items():
        write_qdq(s.pre, real, path, m, [], "tensorrt")
        _same(_unoptimized(sim.path, s.search, sim.inputs(None, method_ranges(path))), _unoptimized(real, s.search), m)
        want = run_model(real, s.search)
        _close(sim.run(s.search, ranges=method_ranges(path)), want, m, ref)
        snr[m] = want
    # the methods do differ here: the test would not see scales that were not fed
    assert not np.allclose(snr["minmax"][0], snr["percentile-99.99"][0])


def test_jetson_search_measures_on_one_simulated_session_and_records_sim_against_real(tmp_path, monkeypatch):
    """A jetson INT8 build that fails verification searches its layers on one simulated graph: no Q/DQ model is
    written and no session made per kept set or per node; the kept set is built for real once and its output
    SNR, simulated and real, is in the manifest (they agree here: qdq=tensorrt is simulated exactly)."""
    import edgekit.converters.tensorrt.search as trt_search
    from edgekit.converters.tensorrt import simulate

    from cancelling import cancelling_pt2

    cancelling_pt2(tmp_path / "m.pt2")  # conv1 writes a feature twice, conv2 takes the difference: a fragile output

    count = {"sims": 0, "search_writes": 0}
    real_init = simulate.Simulation.__init__

    def counted(self, *a, **kw):
        count["sims"] += 1
        real_init(self, *a, **kw)

    def no_write(*a, **kw):  # the search's per-set builder (qdq=all only)
        count["search_writes"] += 1
        raise AssertionError("the search wrote a Q/DQ model")

    monkeypatch.setattr(simulate.Simulation, "__init__", counted)
    monkeypatch.setattr(trt_search, "write_qdq", no_write)
    res = convert(str(tmp_path / "m.pt2"), target="jetson", precision="int8", calib=str(tmp_path / "calib.npz"),
                  out=tmp_path / "int8", fail_on_verification=False, cache=False)
    man = json.loads((res.out_dir / "manifest.json").read_text())
    mixed = next(v for k, v in _walk(man) if k == "mixed_precision")
    assert mixed["builds"] >= 1 and mixed["kept"], mixed
    # one simulated session for the calibration choice, one for the layer search (a later stage; the graph file is
    # written once and loaded again), however many nodes and kept sets were measured
    assert count == {"sims": 2, "search_writes": 0}, count
    q = next(v for k, v in _walk(man) if k == "quantization" and isinstance(v, dict) and "calibration_method" in v)
    check = q["simulated_vs_real"]
    assert check["simulated"] and check["kept"] == len(mixed["kept"]), check
    assert check["difference_db"] is not None and abs(check["difference_db"]) < 0.05, check


def _walk(d):
    if isinstance(d, dict):
        for k, v in d.items():
            yield k, v
            yield from _walk(v)
    elif isinstance(d, list):
        for v in d:
            yield from _walk(v)


def test_minmax_ranges_from_the_shared_histogram_pass_equal_onnxruntimes_minmax_calibrator(small, tmp_path):
    """With the histograms shared (calibration=auto), min-max takes its ranges from their first pass, not a pass of
    its own: the same ranges onnxruntime's MinMax calibrator computes (calibrated_ranges without a shared dict)."""
    from edgekit.converters.tensorrt.calibration import calibrated_ranges
    from edgekit.converters.tensorrt.simulate import method_ranges

    import onnx

    name = onnx.load(str(small.pre)).graph.input[0].name
    x = np.random.default_rng(0).normal(0, 1, (48, 1, 8, 8)).astype(np.float32)
    own = calibrated_ranges(SimpleNamespace(work_dir=tmp_path, options={}), small.pre, [{name: x[i:i + 1]} for i in range(32)],
                            "minmax")
    shared, alone = method_ranges(small.ranges["minmax"]), method_ranges(own)
    assert sorted(shared) == sorted(alone)
    for t, (lo, hi) in alone.items():
        assert np.allclose(np.ravel(shared[t]), np.ravel([lo, hi]), rtol=1e-6, atol=0), t


def test_tensorrt_placement_calibrates_its_ops_tensors_only_and_rounds_every_input(small):
    """Under ``qdq=tensorrt`` the calibration collects the tensors of the ops TensorRT runs in INT8 (onnxruntime's
    calibrator takes every tensor otherwise), and the Q/DQ model still rounds every activation those ops read."""
    import onnx

    from edgekit.converters.tensorrt.qdq import TRT_QDQ_OPS, write_qdq
    from edgekit.converters.tensorrt.simulate import method_ranges

    graph = onnx.load(str(small.pre)).graph
    inits = {i.name for i in graph.initializer}
    ops = [n for n in graph.node if n.op_type in TRT_QDQ_OPS]
    reads = {n.input[0] for n in ops if n.input[0] not in inits}
    ranged = set(method_ranges(small.ranges["minmax"]))
    assert reads <= ranged <= {t for n in ops for t in (*n.input, *n.output)}, (reads, ranged)
    left_out = {n.output[0] for n in graph.node if n.op_type == "Relu"} - ranged  # e.g. the Relus the Sub reads
    assert left_out, "every tensor was calibrated"
    write_qdq(small.pre, small.tmp / "all-q.onnx", small.ranges["minmax"], "minmax", [], "tensorrt")
    quantized = {n.input[0] for n in onnx.load(str(small.tmp / "all-q.onnx")).graph.node if n.op_type == "QuantizeLinear"}
    assert reads <= quantized, reads - quantized


def test_the_chosen_calibrations_real_build_is_the_artifact_not_written_twice(small, tmp_path, monkeypatch):
    """calibration=auto builds the methods best by simulation for real (quantize.CONFIRM): the chosen one's build
    becomes the artifact, so the Q/DQ writer runs once per confirmed method and no more, and model.onnx holds that
    build's graph."""
    import onnx

    from edgekit.converters.tensorrt import quantize as q

    graphs: dict[str, bytes] = {}
    real = q.write_qdq

    def recorded(pre, dest, *a, **kw):
        real(pre, dest, *a, **kw)
        graphs[dest.name] = onnx.load(str(dest)).graph.SerializeToString()

    monkeypatch.setattr(q, "write_qdq", recorded)
    x = np.random.default_rng(0).normal(0, 1, (48, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    res = convert(str(small.tmp / "net.pt2"), target="jetson", precision="int8", calib=str(tmp_path / "calib.npz"),
                  out=tmp_path / "int8", fail_on_verification=False, cache=False)
    rec = json.loads((res.out_dir / "manifest.json").read_text())
    chosen = next(v for k, v in _walk(rec) if k == "calibration_method")
    assert len(graphs) == q.CONFIRM and set(graphs) <= {f"int8-{m}.onnx" for m in q.CALIBRATIONS}, sorted(graphs)
    built = onnx.load(str(res.out_dir / "model.onnx")).graph.SerializeToString()
    assert built == graphs[f"int8-{chosen}.onnx"], chosen
