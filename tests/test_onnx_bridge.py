"""ONNX models as published ones are (dynamic dims, scalar inputs picking an If branch, data-dependent If,
LSTM, inputs named out of order): prepared, bridged to torch for the torch-only targets, and checked
against onnxruntime on the file as given. Small graphs built here; the zoo (tests/test_zoo.py) runs real ones."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import InputSpecError
from edgekit.ingest import load_model

IR = 9  # onnxruntime 1.32 reads IR <= 10 (onnx 1.21's make_model writes newer)


def _save(graph, path, opset=17):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _vad_like(path):
    """x [batch, samples] and a scalar sr: If(sr == 16000) picks a branch (x * 2) else (x * 3); out = Relu."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    three = helper.make_tensor("three", TensorProto.FLOAT, [], [3.0])
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "three"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["y"], ["out"])]
    g = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "samples"]),
                                         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "samples"])],
                          [two, three, numpy_helper.from_array(np.array(16000, np.int64), "sr16k")])
    return _save(g, path)


def test_const_folds_the_if_branch_and_names_shapes(tmp_path):
    p = _vad_like(tmp_path / "vad.onnx")
    with pytest.raises(InputSpecError, match=r"input 'x' has dynamic dimensions \[batch, samples\].*--input-shape x:1,N"):
        load_model(p, None, consts=["sr=16000"])
    m = load_model(p, ["x:1,8"], consts=["sr=16000"])
    assert [s.name for s in m.inputs] == ["x"] and m.inputs[0].shape == (1, 8)
    assert any("sr folded" in s for s in m.onnx_prep.steps)
    ops = {n.op_type for n in onnx.load(str(m.onnx_path)).graph.node}
    assert "If" not in ops and "Where" not in ops  # the branch was chosen, not both computed
    x = np.linspace(-1, 1, 8, dtype=np.float32)[None]
    np.testing.assert_allclose(m.reference()({"x": x})[0], np.maximum(x * 2, 0), rtol=1e-6)
    m8 = load_model(p, ["x:1,8"], consts=["sr=8000"])
    np.testing.assert_allclose(m8.reference()({"x": x})[0], np.maximum(x * 3, 0), rtol=1e-6)
    with pytest.raises(InputSpecError, match="no input 'rate'"):
        load_model(p, ["x:1,8"], consts=["rate=16000"])


def test_data_dependent_if_is_selected_with_where_and_bridged(tmp_path):
    """If(mean(x) > 0) -> x * 2 else -x: both branches computed, Where selects; the torch bridge matches."""
    from edgekit.onnx_bridge import bridge_model

    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["a"])], "then", [],
                               [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [],
                               [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
             helper.make_node("Greater", ["m", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "dd", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [zero])
    p = _save(g, tmp_path / "dd.onnx")
    m = load_model(p)
    assert any("Where" in s for s in m.onnx_prep.steps)
    bridged = bridge_model(m, str(p))
    import torch

    for x in (np.array([[1, 2, 3, 4]], np.float32), np.array([[-1, -2, 3, -4]], np.float32)):
        want = x * 2 if x.mean() > 0 else -x
        np.testing.assert_allclose(m.reference()({"x": x})[0], want)
        np.testing.assert_allclose(bridged.exported.module()(torch.from_numpy(x)).numpy(), want)


def test_named_shapes_apply_by_name_not_position(tmp_path):
    nodes = [helper.make_node("Add", ["a", "b"], ["out"])]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, "n"]),
                                         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["k", 1])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["k", "n"])])
    p = _save(g, tmp_path / "two.onnx", opset=13)
    m = load_model(p, ["b:3,1", "a:1,5"])  # given in the other order: applied by name
    assert {s.name: s.shape for s in m.inputs} == {"a": (1, 5), "b": (3, 1)}
    assert m.outputs[0].shape == (3, 5)
    with pytest.raises(InputSpecError, match=r"input 'a' has shape \[1, n\]; --input-shape a:2,5 does not fit"):
        load_model(p, ["a:2,5", "b:3,1"])


def test_lstm_bridges_to_torch_and_matches_onnxruntime(tmp_path):
    """A bidirectional LSTM exported by torch.onnx (ONNX LSTM op: onnx2torch 1.5 has no converter; edgekit's)."""
    import torch

    from edgekit.onnx_bridge import bridge_model

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(6, 5, bidirectional=True)
            self.fc = torch.nn.Linear(10, 3)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.fc(y[-1])

    torch.manual_seed(0)
    net = Net().eval()
    p = tmp_path / "lstm.onnx"
    torch.onnx.export(net, (torch.randn(7, 1, 6),), str(p), dynamo=False, opset_version=14)
    assert "LSTM" in {n.op_type for n in onnx.load(str(p)).graph.node}
    m = load_model(p)
    b = bridge_model(m, str(p))
    x = np.random.default_rng(0).standard_normal((7, 1, 6)).astype(np.float32)
    got = b.exported.module()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, m.reference()({m.inputs[0].name: x})[0], atol=1e-5)
    np.testing.assert_allclose(got, net(torch.from_numpy(x)).detach().numpy(), atol=1e-5)


def test_quantized_onnx_is_refused_for_torch_targets_with_the_reason(tmp_path):
    from edgekit.errors import UnsupportedOpError
    from edgekit.onnx_bridge import bridge_model
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w])
    f = _save(g, tmp_path / "f.onnx", opset=13)
    q = tmp_path / "q.onnx"
    quantize_dynamic(str(f), str(q), weight_type=QuantType.QInt8)
    m = load_model(q)
    assert m.onnx_prep.quantized_ops
    with pytest.raises(UnsupportedOpError, match="already quantized .*MatMulInteger.*give the float ONNX model"):
        bridge_model(m, str(q))


def test_manifest_records_the_preparation_and_the_bridge(tmp_path):
    """A build of an ONNX file for a torch-only converter says, in its manifest and report, that the input sr was
    folded to 16000 (the artifact has no such input) and which bridge rebuilt the graph; the kind stays onnx."""
    from edgekit.pipeline import convert

    p = _vad_like(tmp_path / "vad.onnx")
    res = convert(p, target="android", precision="fp32", input_shape=["x:1,8"], consts=["sr=16000"],
                  out=tmp_path / "o", golden_count=8)
    src = res.manifest["source_model"]
    assert src["kind"] == "onnx" and src["consts"] == {"sr": 16000} and src["bridge"].startswith("onnx2torch")
    assert any("sr folded" in s for s in src["prepared"])
    assert [i["name"] for i in res.manifest["inputs"]] == ["x"]
    report = (res.out_dir / "report.md").read_text()
    assert "prepared: input sr folded" in report and "rebuilt in torch by onnx2torch" in report
