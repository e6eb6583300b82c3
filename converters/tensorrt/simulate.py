"""The simulated INT8 graph: the build's Q/DQ model, written once, in which each quantized node's rounding can be
switched off and each activation's int8 scale set, by graph inputs. One onnxruntime session then measures any
set of nodes kept float (the mixed-precision search) and any calibration method's ranges (the calibration
choice) on the search samples, without writing, loading or optimizing another model for each.

How: every node of the Q/DQ model that reads a DequantizeLinear output (a convolution's or MatMul's activation
and weight, under ``qdq=tensorrt``) reads instead ``If(q)`` of (dequantized, float), where ``float`` is the tensor
the pair stands for in the float model (a weight: the float initializer) and ``q`` a boolean graph input: for a
weight, the node's own (``edgekit.q:<node>``); for an activation, the tensor's (``edgekit.qa:<tensor>``), on
where any node that reads it is quantized: quantize_static gives an activation that one quantized node wants
one Q/DQ pair that every reader reads, a node it was told to exclude too (its weights stay float). Every
activation QuantizeLinear / DequantizeLinear scale is a graph input named as the scale initializer it replaces,
fed from a calibration method's ranges by onnxruntime's own rule (symmetric int8: max |range| / 127). So with a
set of nodes switched on and one method's scales, the graph computes what that method's Q/DQ model with every
other node excluded computes (``qdq=tensorrt``: pairs on the inputs of the nodes TensorRT runs in INT8 only);
with nothing switched on it is the float model.

The simulation runs each Q/DQ pair as onnxruntime runs it in the real model on this host, except where
onnxruntime fuses a pair into an integer kernel in the real model (under ``qdq=all``, a node quantized on its
input and output: QLinearConv and the like), which the If between them prevents; the chosen configuration is
still built for real and verified, and the build records the simulated against the real output SNR."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgekit.converters import ConvertJob, load_firmware
from edgekit.converters.tensorrt.qdq import write_qdq
from edgekit.deps import require

SWITCH = "edgekit.q:"  # the boolean graph input that switches a node's weight rounding on: SWITCH + node name
TENSOR = "edgekit.qa:"  # ... and an activation's rounding, for every node that reads it: TENSOR + tensor name
FILE = "simulated.onnx"  # in the work folder, with SIDECAR: the float model and ranges it was written from


def int8_scale(lo, hi) -> np.ndarray:
    """The activation scale quantize_static writes for the range [lo, hi] (symmetric int8, onnxruntime's rule)."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(TensorProto.INT8, reduce_range=False, symmetric=True)
    _zero, scale = compute_scale_zp(np.asarray(lo), np.asarray(hi), qmin, qmax, True, None)
    return np.asarray(scale, np.float32).reshape(())


def method_ranges(path: Path) -> dict[str, tuple]:
    """A ranges cache (calibration.calibrated_ranges) as {tensor: (lo, hi)}, the arrays as quantize_static reads
    them."""
    data = require("onnxruntime.quantization.calibrate", "jetson").load_tensors_data(path)
    return {t: (d.range_value[0], d.range_value[1]) for t, d in data.data.items()}


class Simulation:
    """One session of the simulated graph (see the module). ``nodes``: the node names it can switch, in graph
    order; ``scales``: scale input -> the activation tensor whose range sets it."""

    def __init__(self, path: Path, nodes: list[str], scales: dict[str, str], default: dict[str, np.ndarray],
                 weighted: list[str] | None = None, users: dict[str, list[str]] | None = None):
        self.path, self.nodes, self.scales = path, nodes, scales
        self.weighted = list(nodes if weighted is None else weighted)  # nodes with a weight switch
        self.users = dict(users or {})  # activation -> the nodes that read it through its Q/DQ pair
        self.model = load_firmware("tensorrt").OnnxRuntimeModel(str(path))  # the bundle runner's session settings
        self._default = default  # the scales the Q/DQ model was written with
        self._fixed: dict[str, np.ndarray] = dict(default)
        self.runs = 0  # passes over a feed list (the search's measure count)

    def scale_feeds(self, ranges: dict[str, tuple]) -> dict[str, np.ndarray]:
        """The scale inputs for a method's ranges ({tensor: (lo, hi)}); a tensor the method has no range for keeps
        the written scale."""
        return {s: (np.asarray(int8_scale(*ranges[t]), np.float32) if t in ranges else self._default[s])
                for s, t in self.scales.items()}

    def use_scales(self, ranges: dict[str, tuple]) -> None:
        """Run with these ranges' scales from now on."""
        self._fixed = self.scale_feeds(ranges)

    def inputs(self, quantized: Iterable[str] | None = None, ranges: dict[str, tuple] | None = None
               ) -> dict[str, np.ndarray]:
        """The switch and scale inputs for the nodes in ``quantized`` rounding (None: all) at the scales of
        ``ranges`` (None: as set by use_scales, else as written)."""
        on = set(self.nodes) if quantized is None else set(quantized)
        extra: dict[str, np.ndarray] = {SWITCH + n: np.array(n in on) for n in self.weighted}
        extra.update({TENSOR + t: np.array(any(n in on for n in ns)) for t, ns in self.users.items()})
        extra.update(self._fixed if ranges is None else self.scale_feeds(ranges))
        return extra

    def run(self, feeds: list[dict[str, np.ndarray]], quantized: Iterable[str] | None = None,
            ranges: dict[str, tuple] | None = None) -> list[np.ndarray]:
        """The outputs on ``feeds`` (merged as run_model merges them) with :meth:`inputs` ``(quantized, ranges)``."""
        from edgekit.verify import run_all

        extra = self.inputs(quantized, ranges)
        sess, names = self.model.sess, self.model.output_names
        self.runs += 1
        return run_all(lambda f: sess.run(names, {**f, **extra}), feeds)

    def float_outputs(self, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """Nothing switched on: the float model's outputs."""
        return self.run(feeds, quantized=())


def simulation(job: ConvertJob, pre: Path, ranges: Path, method: str, excluded: list[str], where: str) -> Simulation:
    """The simulated graph of ``pre`` (Q/DQ written from the ranges cache ``ranges``, method ``method``, the nodes in
    ``excluded`` left float, placement ``where``), written once per work folder and float model: a later stage of
    the same build (the layer search after the calibration choice) loads the same file."""
    from edgekit.fsutil import sha256_file

    dest = job.work_dir / FILE
    side = dest.with_suffix(".json")
    key = {"schema": 2, "pre": sha256_file(pre), "excluded": sorted(excluded), "where": where}
    try:
        meta = json.loads(side.read_text())
    except (OSError, ValueError):
        meta = None
    if meta is None or meta.get("key") != key or not dest.is_file():
        meta = {"key": key, **write_simulated(pre, dest, ranges, method, excluded, where)}
        side.write_text(json.dumps(meta))
    default = {s: np.asarray(v, np.float32) for s, v in meta["default"].items()}
    return Simulation(dest, meta["nodes"], meta["scales"], default, meta["weighted"], meta["users"])


def write_simulated(pre: Path, dest: Path, ranges: Path, method: str, excluded: list[str], where: str) -> dict:
    """Write the simulated graph of ``pre`` to ``dest``; returns {"nodes", "scales", "default"} (see Simulation)."""
    onnx = require("onnx", "jetson")
    from onnx import TensorProto, helper, numpy_helper

    qdq = dest.with_name(dest.stem + "-qdq.onnx")
    write_qdq(pre, qdq, ranges, method, excluded, where)
    proto = onnx.load(str(qdq))
    qdq.unlink()
    base = onnx.load(str(pre))
    originals = {n.name: list(n.input) for n in base.graph.node if n.name}
    dequantized = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    have = {i.name for i in proto.graph.initializer}
    floats = {i.name: i for i in base.graph.initializer if i.name not in have}  # the weights Q/DQ replaced
    taken = {t for n in proto.graph.node for t in (*n.input, *n.output)} | have
    nodes: list[str] = []
    users: dict[str, list[str]] = {}  # a float activation -> the switchable nodes that read it through Q/DQ
    order = []  # the nodes, each switched one after its Where nodes (graph order stays topological)
    made = 0
    added: set[str] = set()
    switches: set[str] = set()
    for n in proto.graph.node:
        order.append(n)
        orig = originals.get(n.name)
        if (n.op_type in ("QuantizeLinear", "DequantizeLinear") or orig is None or len(orig) != len(n.input)
                or not any(t in dequantized for t in n.input)):
            continue
        own = n.name not in excluded
        if own:
            nodes.append(n.name)
        for i, (t, o) in enumerate(zip(list(n.input), orig, strict=True)):
            if t not in dequantized or t == o:
                continue
            if o in floats:  # a weight: the node's own
                if not own:
                    continue
                switch = SWITCH + n.name
                if o not in added:
                    proto.graph.initializer.append(floats[o])
                    added.add(o)
            else:  # an activation: one pair for all its readers (quantize_static's), on where any is quantized
                switch = TENSOR + o
                if own:
                    users.setdefault(o, []).append(n.name)
            mixed = f"{t}/edgekit.sim.{made}"
            made += 1
            while mixed in taken:
                mixed += "_"
            taken.add(mixed)
            order.insert(len(order) - 1, helper.make_node("Where", [switch, t, o], [mixed],
                                                          name=f"edgekit.sim.{mixed}"))
            n.input[i] = mixed
            if switch not in switches:
                switches.add(switch)
                proto.graph.input.append(helper.make_tensor_value_info(switch, TensorProto.BOOL, []))
    for t in {s[len(TENSOR):] for s in switches if s.startswith(TENSOR)} - set(users):
        users[t] = []  # read through Q/DQ by kept nodes only (another wants it quantized; never here)
    order = [onnx.NodeProto.FromString(n.SerializeToString()) for n in order]  # detached from the graph
    del proto.graph.node[:]
    proto.graph.node.extend(order)
    # the activation scales: the scale initializers of QuantizeLinear nodes on calibrated tensors, and of the
    # DequantizeLinear nodes those feed, made graph inputs
    ranged = method_ranges(ranges)
    inits = {i.name: i for i in proto.graph.initializer}
    q_of = {n.output[0]: n for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    scales: dict[str, str] = {}
    for n in proto.graph.node:
        if n.op_type == "QuantizeLinear":
            tensor = n.input[0]
        elif n.op_type == "DequantizeLinear" and n.input[0] in q_of:
            tensor = q_of[n.input[0]].input[0]
        else:
            continue
        s = n.input[1]
        if tensor in ranged and s in inits and numpy_helper.to_array(inits[s]).size == 1:
            scales[s] = tensor
    default = {}
    for s in scales:
        init = inits[s]
        default[s] = float(numpy_helper.to_array(init).reshape(()))
        proto.graph.initializer.remove(init)
        proto.graph.input.append(helper.make_tensor_value_info(s, init.data_type, []))
    _branch_switches(proto.graph)
    onnx.save(proto, str(dest))
    nodes_with_weights = sorted({s[len(SWITCH):] for s in switches if s.startswith(SWITCH)})
    return {"nodes": nodes, "weighted": nodes_with_weights, "users": users, "scales": scales, "default": default}



def _branch_switches(graph) -> None:
    """Each ``Where(q, dequantized, float)`` becomes ``If(q)``: its then-branch computes the QuantizeLinear /
    DequantizeLinear pair (moved into it where only this switch reads them), its else-branch passes the float
    tensor. Where computes both inputs on every run, so a switched-off pair still cost its two elementwise passes;
    If runs one branch (ddddocr-det at 416x416: 0.115 -> 0.073 s a sample, bit-identical outputs). Readers of
    one pair under one switch share one If."""
    from onnx import TensorProto, helper

    every = list(graph.node)  # one list of the nodes for both passes: they are told apart by id()
    prod = {o: n for n in every for o in n.output}
    readers: dict[str, int] = {}
    for n in every:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    for o in graph.output:
        readers[o.name] = readers.get(o.name, 0) + 1
    switched = [n for n in every if n.op_type == "Where" and n.name.startswith("edgekit.sim.")]
    by_key: dict[tuple[str, str], list] = {}
    for w in switched:
        by_key.setdefault((w.input[0], w.input[1]), []).append(w)
    moved: set[int] = set()
    swap: dict[int, object] = {}  # id(Where) -> its If (the first of a key); the others are dropped
    alias: dict[str, str] = {}
    for (switch, t), ws in by_key.items():
        first = ws[0]
        out, flt = first.output[0], first.input[2]
        for w in ws[1:]:
            alias[w.output[0]] = out
        chain = []
        dq = prod.get(t)
        if dq is not None and dq.op_type == "DequantizeLinear" and readers[t] == len(ws):
            chain = [dq]
            q = prod.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and readers[q.output[0]] == 1:
                chain.insert(0, q)
        moved.update(id(c) for c in chain)
        body = ([onnx_copy(c) for c in chain] if chain else [helper.make_node("Identity", [t], [f"{out}/then"])])
        then_out = t if chain else f"{out}/then"
        then_g = helper.make_graph(body, f"{out}/then", [],
                                   [helper.make_tensor_value_info(then_out, TensorProto.FLOAT, None)])
        else_g = helper.make_graph([helper.make_node("Identity", [flt], [f"{out}/else"])], f"{out}/else", [],
                                   [helper.make_tensor_value_info(f"{out}/else", TensorProto.FLOAT, None)])
        swap[id(first)] = helper.make_node("If", [switch], [out], name=first.name, then_branch=then_g,
                                           else_branch=else_g)
        for w in ws[1:]:
            swap[id(w)] = None
    nodes = []
    for n in every:
        if id(n) in moved:
            continue
        if id(n) in swap:
            if swap[id(n)] is not None:
                nodes.append(swap[id(n)])
            continue
        c = onnx_copy(n)
        for i, x in enumerate(c.input):
            c.input[i] = alias.get(x, x)
        nodes.append(c)
    del graph.node[:]
    graph.node.extend(nodes)


def onnx_copy(node):
    """A detached copy of a NodeProto."""
    return type(node).FromString(node.SerializeToString())
