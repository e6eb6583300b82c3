"""Exact rewrites before quantization: Mul/Add by a per-channel constant after a Conv / ConvTranspose is folded
into its weights (edgekit/onnx_fuse.py, every target), HardSwish as paddle2onnx writes it becomes one HARD_SWISH op
in android's INT8 build (converters/tflite/int8_rewrites.py). Each graph is built here the way the exporter writes it;
onnxruntime runs the file as given and as prepared (the same function), and the real PP-OCR cls model converts to
a passing android INT8 build (tests/test_zoo.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgekit.ingest import load_model

IR = 9


def _save(nodes, inits, path, x_shape, y_shape, opset=12):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = IR
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


HARDSWISH_CONSTS = {"three": 3.0, "zero": 0.0, "six": 6.0, "sixth": 6.0}


def _hardswish(x: str, out: str) -> list:
    """HardSwish as paddle2onnx writes it: x * clip(x + 3, 0, 6) / 6 (constants: HARDSWISH_CONSTS)."""
    return [helper.make_node("Add", [x, "three"], [out + "_3"]),
            helper.make_node("Clip", [out + "_3", "zero", "six"], [out + "_r6"]),
            helper.make_node("Mul", [x, out + "_r6"], [out + "_xr6"]),
            helper.make_node("Div", [out + "_xr6", "sixth"], [out])]


def _run(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def _ops(m):
    return [n.op_type for n in onnx.load(str(m.onnx_path)).graph.node]


def test_paddle_affine_blocks_fold_into_the_conv_and_hardswish_stays_as_published(tmp_path):
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4), "a": [0.9],
             "c": rng.standard_normal((1, 4, 1, 1)), "w2": rng.standard_normal((5, 4, 1, 1)), **HARDSWISH_CONSTS}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["a", "conv"], ["scaled"]),  # the constant first, as paddle2onnx writes it
             helper.make_node("Add", ["scaled", "c"], ["t"]),
             *_hardswish("t", "hs"),
             helper.make_node("Conv", ["hs", "w2"], ["y"])]
    p = _save(nodes, inits, tmp_path / "lcnet.onnx", [1, 3, 8, 8], [1, 5, 8, 8])
    m = load_model(p)
    ops = _ops(m)
    # the affine pair is gone; the HardSwish chain stays (Div by 6 as Mul by 1/6): float builds run it as published
    assert ops == ["Conv", "Add", "Clip", "Mul", "Mul", "Conv"], ops
    assert any("2 Mul/Add" in s for s in m.onnx_prep.steps), m.onnx_prep.steps
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32) * 3
    np.testing.assert_allclose(_run(m.onnx_path, x), _run(p, x), rtol=1e-5, atol=1e-5)


def test_conv_transpose_with_groups_folds_per_output_channel(tmp_path):
    rng = np.random.default_rng(1)
    # ConvTranspose weight [in, out/group, k, k]: 2 groups of 2 in -> 3 out each: 6 output channels
    inits = {"w": rng.standard_normal((4, 3, 2, 2)), "b": rng.standard_normal(6),
             "s": rng.uniform(0.5, 2, (6, 1, 1)), "t": rng.standard_normal((6, 1, 1))}
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["d"], strides=[2, 2], group=2),
             helper.make_node("Mul", ["d", "s"], ["ds"]), helper.make_node("Add", ["ds", "t"], ["y"])]
    p = _save(nodes, inits, tmp_path / "deconv.onnx", [1, 4, 5, 5], [1, 6, 10, 10])
    m = load_model(p)
    assert _ops(m) == ["ConvTranspose"]
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(m.onnx_path, x), _run(p, x), rtol=1e-5, atol=1e-5)


def test_what_is_not_exact_is_left_alone(tmp_path):
    """A conv output read twice and a constant that varies along the width are not folded, and the graph still
    computes the same thing."""
    rng = np.random.default_rng(2)
    inits = {"w": rng.standard_normal((4, 3, 1, 1)), "k": rng.standard_normal((1, 1, 1, 6)), "m": [2.0],
             "three": 3.0, "zero": 0.0, "five": 5.0, "sixth": 1 / 6}
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"]),
             helper.make_node("Mul", ["conv", "m"], ["twice"]),
             helper.make_node("Relu", ["conv"], ["r"]),  # a second reader of the conv output
             helper.make_node("Mul", ["r", "k"], ["rk"]),  # one value per column, not per channel
             helper.make_node("Add", ["rk", "three"], ["a3"]),
             helper.make_node("Clip", ["a3", "zero", "five"], ["c5"]),  # not a HardSwish clip
             helper.make_node("Mul", ["rk", "c5"], ["p"]),
             helper.make_node("Mul", ["p", "sixth"], ["q"]),
             helper.make_node("HardSigmoid", ["q"], ["hsig"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["q", "hsig"], ["g"]),
             helper.make_node("Add", ["g", "twice"], ["y"])]
    p = _save(nodes, inits, tmp_path / "keep.onnx", [1, 3, 4, 6], [1, 4, 4, 6])
    m = load_model(p)
    ops = _ops(m)
    assert ops.count("Conv") == 1 and ops.count("Mul") == 5, ops
    assert not any("folded into" in s for s in m.onnx_prep.steps)
    x = rng.standard_normal((1, 3, 4, 6)).astype(np.float32) * 3
    np.testing.assert_allclose(_run(m.onnx_path, x), _run(p, x), rtol=1e-5, atol=1e-5)


def test_values_an_if_branch_reads_are_not_folded_away(tmp_path):
    """An If branch reads outer values by name: a conv output it reads is not folded (the name would vanish), and
    a constant it reads stays in the graph when the Mul that also read it is folded."""
    rng = np.random.default_rng(4)
    inits = {"w": rng.standard_normal((2, 3, 1, 1)), "v": rng.standard_normal((2, 3, 1, 1)), "a": [2.0],
             "zero": 0.0}
    then_g = helper.make_graph([helper.make_node("Mul", ["conv_v", "a"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [1, 2, 4, 4])])
    else_g = helper.make_graph([helper.make_node("Identity", ["conv_v"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [1, 2, 4, 4])])
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv_w"]),
             helper.make_node("Mul", ["conv_w", "a"], ["scaled"]),  # foldable; "a" is read in a branch too
             helper.make_node("Conv", ["x", "v"], ["conv_v"]),
             helper.make_node("Mul", ["conv_v", "a"], ["v2"]),  # conv_v is read in both branches: not folded
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["picked"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["scaled", "picked"], ["sp"]),
             helper.make_node("Add", ["sp", "v2"], ["y"])]
    p = _save(nodes, inits, tmp_path / "if.onnx", [1, 3, 4, 4], [1, 2, 4, 4], opset=13)
    m = load_model(p)
    assert any("1 Mul/Add" in s for s in m.onnx_prep.steps), m.onnx_prep.steps
    for x in (rng.standard_normal((1, 3, 4, 4)).astype(np.float32) + k for k in (-5.0, 5.0)):  # both branches
        np.testing.assert_allclose(_run(m.onnx_path, x), _run(p, x), rtol=1e-5, atol=1e-5)


def test_written_out_hardswish_runs_on_xnnpack_int8_kernels_on_android_and_verifies_on_ios(tmp_path):
    """android INT8: paddle2onnx's x * clip(x + 3, 0, 6) / 6 stays ADD (RELU6 fused) and MUL, which XNNPACK runs in
    int8; ``hard_activations=fused`` makes it one HARD_SWISH op (one rounding instead of three, but no XNNPACK
    int8 kernel). Both verify; ios fp16 converts the graph as published and verifies."""
    from edgekit.pipeline import convert

    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((8, 3, 3, 3)) * 0.5, "a": [1.3], "w2": rng.standard_normal((4, 8, 1, 1)) * 0.3,
             **HARDSWISH_CONSTS}
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["conv", "a"], ["t"]),
             *_hardswish("t", "hs"),
             helper.make_node("Conv", ["hs", "w2"], ["y"])]
    p = _save(nodes, inits, tmp_path / "hs.onnx", [1, 3, 8, 8], [1, 4, 8, 8])
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=rng.standard_normal((64, 3, 8, 8)).astype(np.float32))
    res = convert(str(p), target="ios", precision="fp16", out=tmp_path / "ios", cache=False,
                  fail_on_verification=False)
    assert res.verification.passed, res.verification.failures
    for option, hard_swish in (({}, 0), ({"hard_activations": "fused"}, 1)):
        res = convert(str(p), target="android", precision="int8", calib=str(calib), out=tmp_path / "android",
                      cache=False, fail_on_verification=False, strict=True, options=option,
                      allow_slower_int8=True)  # this test is about the ops; speed: tests/test_speed.py
        assert res.verification.passed, (option, res.verification.failures)
        ops = res.manifest["artifact"]["op_counts"]
        assert ops.get("HARD_SWISH", 0) == hard_swish and res.manifest["artifact"]["full_integer"], (option, ops)
        if not hard_swish:
            assert ops.get("ADD", 0) >= 1 and ops.get("MUL", 0) >= 2, ops
            assert not res.manifest["artifact"]["not_delegable_int8"]


def _pad_pool(value: float, pads: list[int]) -> onnx.ModelProto:
    """x -> Pad(constant ``value``, ``pads``) -> MaxPool 3x3 stride 2, as onnx2torch writes Keras' SAME pooling."""
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode="constant"),
             helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array(value, np.float32), "value")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def test_minus_inf_padding_folds_into_the_max_pool_exactly():
    """Pad(-inf) -> MaxPool is MaxPool with pads (a max pool pads with -inf itself): folded, same outputs, and no
    tensor holds -inf any more (onnxruntime's INT8 histogram calibrators stop at one, jetson's fine-tuned Keras
    models met it). A Pad of another value, or one over the channels, is a different function: left alone."""
    from edgekit.onnx_fuse import fold_pad_into_maxpool

    x = np.random.default_rng(0).normal(size=(1, 4, 10, 10)).astype(np.float32)
    run = lambda p: ort.InferenceSession(p.SerializeToString()).run(None, {"x": x})[0]  # noqa: E731
    m = _pad_pool(-np.inf, [0, 0, 0, 0, 0, 0, 1, 1])
    want = run(m)
    assert fold_pad_into_maxpool(m) == 1
    assert [n.op_type for n in m.graph.node] == ["MaxPool"]
    assert not m.graph.initializer  # the pad amounts and the -inf went with the Pad
    assert list(next(a for a in m.graph.node[0].attribute if a.name == "pads").ints) == [0, 0, 1, 1]
    np.testing.assert_array_equal(run(m), want)
    for value, pads in ((0.0, [0, 0, 0, 0, 0, 0, 1, 1]), (-np.inf, [0, 1, 0, 0, 0, 0, 1, 1])):
        other = _pad_pool(value, pads)
        assert fold_pad_into_maxpool(other) == 0 and len(other.graph.node) == 2
