"""FPGA fabric: power-of-two-scaled QONNX -> hls4ml HLS project, bit-exact C simulation.

1. quantize (``fpga_quant``): brevitas PTQ, ``int8`` (8-bit weights/activations) or
   ``int4`` (4-bit weights/activations, 8-bit input), power-of-two scales, quantized bias;
   exported as QONNX (``model.qonnx.onnx``): QONNX execution is the integer-exact reference.
2. estimate (``fpga_resources``): DSP/BRAM36/LUT/FF against the board for reuse factors
   1, 2, 4, ...; the smallest that fits is used. An estimate until Vivado reports.
3. convert: hls4ml with per-layer precision inferred from the quantizers (``auto`` types:
   no layer can wrap), ``io_stream`` for CNNs, ``io_parallel`` for MLPs. Boards that hls4ml
   knows (pynq-z2) get the VivadoAccelerator backend (block design, AXI DMA, PYNQ driver);
   the others get the bare Vitis HLS IP with the board's part.
4. compile the C simulation with g++ and require it to be bit-exact against QONNX
   execution on the calibration samples; the host runner repeats the check on every input
   it sees (golden and eval sets). A mismatch names the first layer where it starts.
No bitstream is made here (that needs Vivado, hours of synthesis); ``build.sh`` in the
bundle makes it where Vivado is installed, and the manifest says so.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from typing import Any

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError, InputSpecError, ProfileError, UnsupportedOpError, VerificationError
from edgekit.quiet import quiet_python

PRIMARY = "model.qonnx.onnx"
HLS_DIR = "hls"
PROJECT = "edgekit_fabric"
FABRIC_GOLDEN = "fabric_golden.npz"
RESOURCES = "resources.json"
CHECK_SAMPLES = 64  # calibration samples checked bit-exact inside convert()
# hls4ml's sigmoid / softmax are 1024-entry lookup tables: the sigmoid table steps its input by 1/64 (slope <= 1/4:
# error <= 1/256); softmax adds an exp and an inverse table of 18-bit entries. Their result type: [0, 1), 16 bits.
TABLE_RESULT = "ufixed<16,0,RND,SAT>"
TABLE_TOL = {"Sigmoid": 2 ** -7, "Softmax": 2 ** -5}
TRACED_SAMPLES = 4  # calibration samples whose every layer before the table is traced and compared bit for bit


class Hls4mlConverter:
    name = "hls4ml"

    def __init__(self) -> None:
        self._compiled: dict[str, dict[str, Any]] = {}  # out_dir -> hls model, qonnx model, input quant

    # ------------------------------------------------------------------ convert
    def convert(self, job: ConvertJob) -> Artifact:
        from edgekit.converters import fpga_quant as fq
        from edgekit.converters import fpga_resources as fr
        from edgekit.onnx_graph import export_onnx, slim

        require("brevitas", "fpga")
        require("qonnx", "fpga")
        hls4ml = require("hls4ml", "fpga")
        fpga = job.board.fpga
        if fpga is None:
            raise ProfileError(f"board {job.board.id} has no [fpga] table (part, LUT, DSP ...); "
                               "choose an FPGA board such as xilinx/pynq-z2")
        if job.precision not in fq.BITS:
            raise ProfileError(f"the fpga target takes {sorted(fq.BITS)}, not {job.precision!r}")
        bits = fq.BITS[job.precision]
        if job.calib is None:
            raise InputSpecError("the FPGA target needs calibration data for its activation scales: "
                                 "give --calib FILE.npz (a few hundred real inputs)")
        spec = job.model.inputs[0]
        calib = np.asarray(job.calib.inputs[spec.name], np.float32)

        # the analyze stage's export (same opset) when there is one; export only for a direct caller
        raw = job.float_onnx or export_onnx(job.model, job.work_dir / "exported.onnx",
                                            job.opset or job.target.opset or 18)
        clean = job.work_dir / "float.onnx"
        slim(raw, clean)
        layers = fq.read_chain(clean)
        is_cnn = any(lay.kind == "conv" for lay in layers)
        po2 = job.options.get("fpga_scales", "po2") == "po2"
        qmodel = fq.build_brevitas(layers, bits, signed_input=bool(calib.min() < 0), po2=po2)
        fq.calibrate(qmodel, calib)
        mw = fq.export_qonnx(qmodel, calib, job.work_dir / "brevitas.onnx", job.out_dir / PRIMARY, is_cnn)
        quants = fq.quant_summary(mw)
        iq = fq.input_quant(mw)
        job.log(f"QONNX: {len(quants)} Quant nodes, {bits}-bit, "
                f"{'all' if all(q['pow2'] for q in quants) else 'NOT all'} scales powers of two")
        if not all(q["pow2"] for q in quants):
            bad = [q["node"] for q in quants if not q["pow2"]]
            raise ConversionError(f"quantizer scales of {', '.join(bad)} are not powers of two: hls4ml's ap_fixed "
                                  "arithmetic can never be bit-exact against QONNX with them (and hls4ml 1.3 fails "
                                  "to convert them); use the default power-of-two scales")

        # resources before synthesis
        costs = fr.layer_costs(layers, bits)
        fifo_bits = _fifo_bits(mw, bits) if is_cnn else []
        est, tried = fr.pick_reuse(costs, fpga, is_cnn, fifo_bits)
        if not est.fits:
            raise UnsupportedOpError(
                f"the model does not fit {job.board.id}: even at reuse factor {est.reuse_factor} (the largest) the "
                f"resource ESTIMATE is {est.dsp} DSP, {est.bram36} BRAM36, {est.lut} LUT, {est.ff} FF against "
                f"{fpga.dsp} DSP, {fpga.bram36} BRAM36, {fpga.lut} LUT, {fpga.ff} FF on the board ({est.limiting} "
                f"over the {fr.FIT_SHARE:.0%} usable); choose a larger FPGA board or a smaller model")
        job.log(f"resource estimate at reuse {est.reuse_factor}: {est.dsp} DSP, {est.bram36} BRAM36, "
                f"{est.lut} LUT, {est.ff} FF ({'fits' if est.fits else 'does NOT fit'} {job.board.id})")

        # hls4ml
        backend = "VivadoAccelerator" if fpga.hls4ml_board else "Vitis"
        prj = job.work_dir / HLS_DIR
        with quiet_python(root_logger=False):
            cfg = hls4ml.utils.config.config_from_onnx_model(
                mw, granularity="name", backend=backend, default_precision="fixed<16,6>",
                default_reuse_factor=est.reuse_factor)
            cfg["Model"]["Strategy"] = "Latency" if est.reuse_factor == 1 else "Resource"
            for lay_cfg in cfg["LayerName"].values():
                lay_cfg["Trace"] = True  # lets a mismatch be traced to its first layer
            # the input layer takes the input quantizer's type (not the 16,6 default): exact, no wrap
            for n in mw.graph.node:  # lookup-table activations on the logits: an unsigned [0, 1] result
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
            in_name = mw.graph.input[0].name
            if fq.is_pow2(iq["scale"]):
                cfg["LayerName"].setdefault(in_name, {}).setdefault("Precision", {})["result"] = _input_type(iq)
            kwargs: dict[str, Any] = {"board": fpga.hls4ml_board} if fpga.hls4ml_board else {"part": fpga.part}
            hm = hls4ml.converters.convert_from_onnx_model(
                mw, output_dir=str(prj), project_name=PROJECT, io_type="io_stream" if is_cnn else "io_parallel",
                backend=backend, hls_config=cfg, clock_period=round(1000.0 / fpga.fabric_clock_mhz, 3), **kwargs)
            t0 = time.perf_counter()
            with job.substep("C-sim compile"):
                hm.compile()
            compile_s = time.perf_counter() - t0
        job.log(f"hls4ml {backend} C simulation compiled with g++ in {compile_s:.1f} s")
        wraps = _wrap_risks(hm)
        if wraps:
            raise VerificationError(f"hls4ml left layers with a fixed precision that may wrap: {wraps}; "
                                    "every layer needs a precision inferred from its quantizer")

        table = next((n for n in mw.graph.node if n.op_type in fq.TABLE_ACTS), None)
        state = {"hm": hm, "mw": mw, "iq": iq, "cnn": is_cnn, "checked": 0, "first_mismatch": None,
                 "table": {"node": table.name, "op": table.op_type, "tolerance": TABLE_TOL[table.op_type]}
                 if table is not None else None}
        self._compiled[str(job.out_dir)] = state
        x = self._fabric_input(state, calib[:CHECK_SAMPLES])
        ref, got = fq.qonnx_execute(mw, x), self._predict(state, x)
        _require_exact(state, x, ref, got, f"{len(x)} calibration samples")
        job.log(f"C simulation bit-exact against QONNX execution on {len(x)} calibration samples")
        n = min(16, len(x))
        # the board's fabric runs the same HLS code as the C simulation: its outputs are the board's golden
        np.savez(job.out_dir / FABRIC_GOLDEN, input=x[:n].reshape(n, -1), output=got[:n].reshape(n, -1))

        # the HLS project goes into the bundle, without the host's compiled library
        shutil.copytree(prj, job.out_dir / HLS_DIR, ignore=shutil.ignore_patterns("*.so", "*.o", "__pycache__"))
        resources = {"board": job.board.id, "part": fpga.part, "chosen": est.to_json(),
                     "tried": [t.to_json() for t in tried], "fit_share": fr.FIT_SHARE,
                     "available": {"dsp": fpga.dsp, "bram36": fpga.bram36, "lut": fpga.lut, "ff": fpga.ff,
                                   "uram": fpga.uram},
                     "note": "ESTIMATE before synthesis; build.sh runs Vivado and writes the real utilization"}
        (job.out_dir / RESOURCES).write_text(json.dumps(resources, indent=2) + "\n")
        files = [PRIMARY, FABRIC_GOLDEN, RESOURCES] + sorted(
            p.relative_to(job.out_dir).as_posix() for p in (job.out_dir / HLS_DIR).rglob("*") if p.is_file())
        why = _no_bitstream_reason()
        notes = [
            f"resource use is an ESTIMATE at reuse factor {est.reuse_factor}: {est.dsp} DSP, {est.bram36} BRAM36, "
            f"{est.lut} LUT of {job.board.id} ({fpga.dsp} DSP, {fpga.bram36} BRAM36, {fpga.lut} LUT); "
            "Vivado's report replaces it",
            f"no bitstream in this bundle: {why}; run ./build.sh where Vivado is installed, "
            "then python3 run.py on the board",
        ]
        if not fpga.hls4ml_board:
            notes.append(f"hls4ml has no {job.board.name} board: the bundle holds the bare HLS IP for part {fpga.part}; "
                         "the block design (Zynq PS + AXI DMA) is built in Vivado (docs/fpga.md)")
        meta = {
            "backend": backend, "part": fpga.part, "hls4ml_board": fpga.hls4ml_board, "project": PROJECT,
            "hls_dir": HLS_DIR, "io_type": "io_stream" if is_cnn else "io_parallel",
            "reuse_factor": est.reuse_factor, "strategy": cfg["Model"]["Strategy"],
            "clock_mhz": fpga.fabric_clock_mhz,
            "quantization": {"tool": "brevitas PTQ", "weights_bits": bits, "activation_bits": bits,
                             "input_bits": iq["bits"], "scales": "power of two" if po2 else "float",
                             "bias": "Int16Bias (scale = input x weight scale)", "quant_nodes": quants,
                             "input_quant": iq, "calibration_samples": len(calib)},
            "layers": [{"name": lay.name, "kind": lay.kind} for lay in layers],
            "precisions": _layer_precisions(hm),
            "bit_exact": state["bit_exact"],
            "table_check": state.get("table_check"),
            "csim_compile_s": round(compile_s, 2),
            "resources_estimate": est.to_json(),
            "bitstream": {"built": False, "reason": why, "build_script": "build.sh"},
            "fabric_golden": FABRIC_GOLDEN,
        }
        return Artifact(format="hls4ml", precision=job.precision, primary=PRIMARY, files=files,
                        runtime=f"hls4ml {hls4ml.__version__} C simulation (g++), bit-exact vs qonnx", meta=meta,
                        notes=notes)

    # ------------------------------------------------------------------ host runner
    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        from edgekit.converters import fpga_quant as fq

        state = self._compiled.get(str(job.out_dir))
        if state is None:
            raise VerificationError("no compiled C simulation for this build: run convert() first in this process")
        name = job.model.inputs[0].name

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            x = self._fabric_input(state, feeds[name])
            ref, got = fq.qonnx_execute(state["mw"], x), self._predict(state, x)
            _require_exact(state, x, ref, got, "verification inputs")
            artifact.meta["bit_exact"] = state["bit_exact"]
            artifact.meta["table_check"] = state.get("table_check")
            return [got.reshape(ref.shape)]

        return run

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _fabric_input(state: dict[str, Any], x: np.ndarray) -> np.ndarray:
        """NCHW float input -> channels-last (CNN) and snapped onto the input quantizer's grid."""
        from edgekit.converters import fpga_quant as fq

        x = np.asarray(x, np.float32)
        if state["cnn"] and x.ndim == 4:
            x = x.transpose(0, 2, 3, 1)
        return fq.quantize_input(np.ascontiguousarray(x), state["iq"])

    @staticmethod
    def _predict(state: dict[str, Any], x: np.ndarray) -> np.ndarray:
        with quiet_python(root_logger=False):
            out = state["hm"].predict(np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32))
        return np.asarray(out, np.float32).reshape(len(x), -1)

    @staticmethod
    def versions() -> dict[str, str]:
        return toolchain_versions("torch", "onnx", "onnxruntime", "brevitas", "qonnx", "hls4ml")


def _require_exact(state: dict[str, Any], x: np.ndarray, ref: np.ndarray, got: np.ndarray, what: str) -> None:
    """Bit-exact C simulation against QONNX execution. With a lookup-table activation at the end (sigmoid,
    softmax), every layer up to the logits must be bit-exact (traced) and the table's output within its
    resolution of the exact function on those logits."""
    ref = ref.reshape(len(x), -1).astype(np.float32)
    got = got.reshape(len(x), -1)
    table = state.get("table")
    if table is not None:
        close = np.max(np.abs(ref - got), axis=1) <= table["tolerance"]
        be = state.setdefault("table_check", {"samples": 0, "within": 0, "max_abs_diff": 0.0, **table})
        be["samples"] += len(x)
        be["within"] += int(close.sum())
        be["max_abs_diff"] = max(be["max_abs_diff"], float(np.max(np.abs(ref - got))) if ref.size else 0.0)
        if not close.all():
            i = int(np.argmin(close))
            raise VerificationError(
                f"hls4ml's {table['op']} table (node {table['node']}) is off by "
                f"{float(np.max(np.abs(ref[i] - got[i]))):.4g} from the exact {table['op']} of the fabric's logits "
                f"(tolerance {table['tolerance']:g}) on {len(x) - int(close.sum())} of {len(x)} {what}")
        # the layers before the table, bit for bit, traced once per build (hls4ml's trace() recompiles the library)
        traced = 0 if state.get("traced") else min(len(x), TRACED_SAMPLES)
        state["traced"] = True
        for k in range(traced):
            layer = first_mismatch(state["hm"], state["mw"], x[k:k + 1], skip=table["node"])
            if layer is not None:
                raise VerificationError(f"hls4ml C simulation is not bit-exact against QONNX execution before the "
                                        f"{table['op']} table on {what}; the mismatch starts at {layer}")
        be = state.setdefault("bit_exact", {"samples": 0, "exact": 0, "max_abs_diff": 0.0,
                                            "checked": f"every layer before the {table['op']} table, traced"})
        be["samples"] += traced
        be["exact"] += traced
        return
    exact = np.all(ref == got, axis=1)
    be = state.setdefault("bit_exact", {"samples": 0, "exact": 0, "max_abs_diff": 0.0})
    be["samples"] += len(x)
    be["exact"] += int(exact.sum())
    be["max_abs_diff"] = max(be["max_abs_diff"], float(np.max(np.abs(ref - got))) if ref.size else 0.0)
    if not exact.all():
        i = int(np.argmin(exact))
        layer = first_mismatch(state["hm"], state["mw"], x[i : i + 1])
        raise VerificationError(
            f"hls4ml C simulation is not bit-exact against QONNX execution on {len(x) - int(exact.sum())} of "
            f"{len(x)} {what} (max |diff| {float(np.max(np.abs(ref - got))):.6g}); the mismatch starts at "
            f"{layer}. Use power-of-two scales and quantized biases (the default); float scales are never exact")


def first_mismatch(hm, mw, x1: np.ndarray, skip: str | None = None) -> str | None:
    """The first hls4ml layer whose C-simulation output matches no QONNX tensor it stands for.

    hls4ml fuses nodes (MatMul + bias Add -> Dense, Relu + Quant -> Relu with the quantized
    type), so a traced layer is compared with every QONNX tensor from its source node up to
    the next compute node; it matches when one of them is equal bit for bit."""
    from edgekit.converters import fpga_quant as fq

    with quiet_python(root_logger=False):
        _, trace = hm.trace(np.ascontiguousarray(x1.reshape(1, -1), dtype=np.float32))
    ctx = fq.qonnx_execute(mw, x1, full=True)
    nodes = list(mw.graph.node)
    index = {n.name: i for i, n in enumerate(nodes)}
    compute = ("MatMul", "Conv", "Relu", "MaxPool", "Flatten")
    for name, value in trace.items():
        base = name.removesuffix("_act")
        for prefix in ("Dense_", "Conv2D_", "Conv1D_"):
            base = base.removeprefix(prefix)
        if base not in index or base == skip:
            continue  # hls4ml-only layer (zero padding, transposes), or the lookup table judged apart
        a = np.asarray(value, np.float64).reshape(-1)
        cands = []
        for k in range(index[base], len(nodes)):
            if k > index[base] and nodes[k].op_type in compute:
                break
            t = ctx.get(nodes[k].output[0])
            if t is not None and np.asarray(t).size == a.size:
                cands.append(np.asarray(t, np.float64).reshape(-1))
        if cands and not any(np.array_equal(a, c) for c in cands):
            diff = min(float(np.max(np.abs(a - c))) for c in cands)
            return f"hls4ml layer {name} (QONNX node {base}, {nodes[index[base]].op_type}; max |diff| {diff:.6g})"
    return None if skip is not None else "the output (every traced intermediate layer matches)"


def _fifo_bits(mw, bits: int) -> list[int]:
    """Bits held by each io_stream FIFO: one feature map per intermediate tensor."""
    out = []
    for n in mw.graph.node:
        if n.op_type in ("Conv", "Relu", "MaxPool", "Quant") and n.input[0] != mw.graph.input[0].name:
            shape = mw.get_tensor_shape(n.output[0])
            if shape and len(shape) == 4:
                out.append(math.prod(shape) * bits)
    return out


def _input_type(iq: dict[str, Any]) -> str:
    """ap_fixed type that holds every value of the input quantizer's grid exactly."""
    frac = -int(round(math.log2(iq["scale"])))
    width = iq["bits"]
    return f"{'fixed' if iq['signed'] else 'ufixed'}<{width},{width - frac}>"


def _layer_precisions(hm) -> dict[str, str]:
    out = {}
    for lay in hm.get_layers():
        t = lay.get_output_variable().type.precision
        out[lay.name] = str(t)
    return out


def _wrap_risks(hm) -> list[str]:
    """Layers still carrying the 16,6 default (that is where a silent wrap would hide)."""
    bad = []
    for lay in hm.get_layers():
        p = lay.get_output_variable().type.precision
        if getattr(p, "width", None) == 16 and getattr(p, "integer", None) == 6:
            bad.append(f"{lay.name} ({p})")
    return bad


def _no_bitstream_reason() -> str:
    if shutil.which("vivado") is None:
        return "Vivado is not installed on this host (no `vivado` on PATH)"
    return "synthesis and place-and-route take hours and are not run inside convert"


CONVERTER = Hls4mlConverter()
