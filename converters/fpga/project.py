"""The hls4ml HLS project: its configuration (per-layer precision inferred from the quantizers, lookup-table
activations typed for the ranges they meet), the project written for the board's backend and its C simulation
compiled; what the project holds (precisions, layers that could wrap, the FIFOs a CNN streams through)."""

from __future__ import annotations

import math
import shutil
import time
from typing import Any

from edgekit.converters import ConvertJob
from edgekit.converters.fpga import quant as fq
from edgekit.deps import require
from edgekit.quiet import quiet_python

HLS_DIR = "hls"
PROJECT = "edgekit_fabric"
# the result type of hls4ml's sigmoid / softmax lookup tables: [0, 1), 16 bits
TABLE_RESULT = "ufixed<16,0,RND,SAT>"


def write_project(job: ConvertJob, mw, iq: dict[str, Any], reuse_factor: int, is_cnn: bool,
                  depthwise: dict[str, int] | None = None) -> dict[str, Any]:
    """The hls4ml project of the QONNX model ``mw`` in the work folder, its C simulation compiled: the hls4ml model
    (``hm``), its config, backend and io type, and the compile time."""
    hls4ml = require("hls4ml", "fpga")
    fpga = job.board.fpga
    backend = "VivadoAccelerator" if fpga.hls4ml_board else "Vitis"
    io_type = "io_stream" if is_cnn else "io_parallel"
    with quiet_python(root_logger=False):
        cfg = hls4ml.utils.config.config_from_onnx_model(
            mw, granularity="name", backend=backend, default_precision="fixed<16,6>",
            default_reuse_factor=reuse_factor)
        cfg["Model"]["Strategy"] = "Latency" if reuse_factor == 1 else "Resource"
        for lay_cfg in cfg["LayerName"].values():
            lay_cfg["Trace"] = True  # lets a mismatch be traced to its first layer
        for name, r in (depthwise or {}).items():  # hls4ml's Resource depthwise conv is wrong in io_stream: Latency
            cfg["LayerName"].setdefault(name, {}).update({"Strategy": "Latency", "ReuseFactor": r})
        _type_tables(mw, cfg)
        # the input layer takes the input quantizer's type (not the 16,6 default): exact, no wrap
        in_name = mw.graph.input[0].name
        if fq.is_pow2(iq["scale"]):
            cfg["LayerName"].setdefault(in_name, {}).setdefault("Precision", {})["result"] = _input_type(iq)
        kwargs: dict[str, Any] = {"board": fpga.hls4ml_board} if fpga.hls4ml_board else {"part": fpga.part}
        hm = hls4ml.converters.convert_from_onnx_model(
            mw, output_dir=str(job.work_dir / HLS_DIR), project_name=PROJECT, io_type=io_type,
            backend=backend, hls_config=cfg, clock_period=round(1000.0 / fpga.fabric_clock_mhz, 3), **kwargs)
        t0 = time.perf_counter()
        with job.substep("C-sim compile"):
            hm.compile()
        compile_s = time.perf_counter() - t0
    job.log(f"hls4ml {backend} C simulation compiled with g++ in {compile_s:.1f} s")
    return {"hm": hm, "cfg": cfg, "backend": backend, "io_type": io_type, "compile_s": compile_s}


def _type_tables(mw, cfg: dict[str, Any]) -> None:
    """Lookup-table activations on the logits: an unsigned [0, 1] result, and softmax's tables indexed over the
    ranges they meet."""
    for n in mw.graph.node:
        if n.op_type in fq.TABLE_ACTS:
            lay_cfg = cfg["LayerName"].setdefault(n.name, {})
            if not isinstance(lay_cfg.get("Precision"), dict):
                lay_cfg["Precision"] = {}
            lay_cfg["Precision"]["result"] = TABLE_RESULT
            if n.op_type == "Softmax":
                # hls4ml indexes its exp and 1/x tables by the top 10 bits of their input types: give
                # them the ranges they meet (x_max - x in [0, 16), a sum of n exps in [1, n]), not 18,8
                shape = mw.get_tensor_shape(n.output[0]) or [1, 2]
                sum_bits = max(1, math.ceil(math.log2(int(shape[-1]) + 1)))
                lay_cfg.update({"inp_norm_t": "ufixed<18,4,RND,SAT>", "exp_table_t": "ufixed<18,1,RND,SAT>",
                                "inv_table_t": "ufixed<18,1,RND,SAT>",
                                "inv_inp_t": f"ufixed<18,{sum_bits},RND,SAT>"})
                lay_cfg["Precision"]["accum"] = f"ufixed<18,{sum_bits},RND,SAT>"


def fifo_bits(mw, bits: int) -> list[int]:
    """Bits held by each io_stream FIFO: one feature map per intermediate tensor."""
    out = []
    for n in mw.graph.node:
        if (n.op_type in ("Conv", "Relu", "MaxPool", "Quant") and n.input[0] != mw.graph.input[0].name
                and mw.get_initializer(n.input[0]) is None):  # a weight's Quant is no stream
            shape = mw.get_tensor_shape(n.output[0])
            if shape and len(shape) == 4:
                out.append(math.prod(shape) * bits)
    return out


def _input_type(iq: dict[str, Any]) -> str:
    """ap_fixed type that holds every value of the input quantizer's grid exactly."""
    frac = -int(round(math.log2(iq["scale"])))
    width = iq["bits"]
    return f"{'fixed' if iq['signed'] else 'ufixed'}<{width},{width - frac}>"


def layer_precisions(hm) -> dict[str, str]:
    out = {}
    for lay in hm.get_layers():
        t = lay.get_output_variable().type.precision
        out[lay.name] = str(t)
    return out


def wrap_risks(hm) -> list[str]:
    """Layers still carrying the 16,6 default (that is where a silent wrap would hide)."""
    bad = []
    for lay in hm.get_layers():
        p = lay.get_output_variable().type.precision
        if getattr(p, "width", None) == 16 and getattr(p, "integer", None) == 6:
            bad.append(f"{lay.name} ({p})")
    return bad


def no_bitstream_reason() -> str:
    if shutil.which("vivado") is None:
        return "Vivado is not installed on this host (no `vivado` on PATH)"
    return "synthesis and place-and-route take hours and are not run inside convert"
