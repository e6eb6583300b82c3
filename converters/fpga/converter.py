"""The hls4ml converter (fpga target): quantize, estimate the fabric, write the HLS project, check its C simulation
bit-exact against QONNX, and put the project, the fabric's golden outputs and the estimate into the build."""

from __future__ import annotations

import json
import shutil
from typing import Any

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner
from edgekit.converters.fpga import graph as fg
from edgekit.converters.fpga import quant as fq
from edgekit import fabric as fr
from edgekit.converters.fpga.csim import CHECK_SAMPLES, TABLE_TOL, fabric_input, predict, require_exact
from edgekit.converters.fpga.project import (HLS_DIR, PROJECT, fifo_bits, layer_precisions, no_bitstream_reason,
                                             wrap_risks, write_project)
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError, InputSpecError, ProfileError, UnsupportedOpError, VerificationError

PRIMARY = "model.qonnx.onnx"
FABRIC_GOLDEN = "fabric_golden.npz"
RESOURCES = "resources.json"


class Hls4mlConverter:
    name = "hls4ml"

    def __init__(self) -> None:
        self._compiled: dict[str, dict[str, Any]] = {}  # out_dir -> hls model, qonnx model, input quant

    def convert(self, job: ConvertJob) -> Artifact:
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
        import onnx

        proto = onnx.load(str(clean))
        perm = fg.strip_input_transpose(proto)  # a channels-last (Keras) input: its Transpose goes
        if perm:
            calib = np.ascontiguousarray(calib.transpose(perm))
            job.log(f"channels-last input: its Transpose {list(perm)} is done on the host before the fabric")
        gm, layers = fg.standardize(fg.to_torch(proto, str(job.model.source)), proto, calib,
                                    job.target.missing_ops)
        is_cnn = any("conv" in lay["kind"] for lay in layers)  # streamed channels-last (io_stream)
        po2 = job.options.get("fpga_scales", "po2") == "po2"
        if not po2:
            raise ConversionError("fpga_scales=float: hls4ml's ap_fixed arithmetic can never be bit-exact against "
                                  "QONNX with float scales (and hls4ml 1.3 fails to convert them); use the default "
                                  "power-of-two scales")
        qmodel = fg.quantize(gm, bits, signed_input=bool(calib.min() < 0))
        fq.calibrate(qmodel, calib)
        mw = fq.export_qonnx(qmodel, calib, job.work_dir / "brevitas.onnx", job.out_dir / PRIMARY, is_cnn)
        quants = fq.quant_summary(mw)
        iq = fq.input_quant(mw)
        job.log(f"QONNX: {len(quants)} Quant nodes, {bits}-bit, "
                f"{'all' if all(q['pow2'] for q in quants) else 'NOT all'} scales powers of two")
        dead = [q["node"] for q in quants if not q["pow2"] and max(q["scale"]) <= 1e-8]
        if dead:
            raise ConversionError(f"the activations quantized by {', '.join(dead[:6])} are all zero on the "
                                  f"{len(calib)} calibration samples (a dead layer, or calibration data unlike the "
                                  "model's inputs): no scale can be chosen; give --calib real inputs")
        if not all(q["pow2"] for q in quants):
            bad = [q["node"] for q in quants if not q["pow2"]]
            raise ConversionError(f"quantizer scales of {', '.join(bad)} are not powers of two: hls4ml's ap_fixed "
                                  "arithmetic can never be bit-exact against QONNX with them (and hls4ml 1.3 fails "
                                  "to convert them); use the default power-of-two scales")

        # resources before synthesis
        costs = fg.qonnx_costs(mw, bits)
        fifos = fifo_bits(mw, bits) if is_cnn else []
        est, tried = fr.pick_reuse(costs, fpga, is_cnn, fifos)
        if not est.fits:
            raise UnsupportedOpError(
                f"the model does not fit {job.board.id}: even at reuse factor {est.reuse_factor} (the largest) the "
                f"resource ESTIMATE is {est.dsp} DSP, {est.bram36} BRAM36, {est.lut} LUT, {est.ff} FF against "
                f"{fpga.dsp} DSP, {fpga.bram36} BRAM36, {fpga.lut} LUT, {fpga.ff} FF on the board ({est.limiting} "
                f"over the {fr.FIT_SHARE:.0%} usable); choose a larger FPGA board or a smaller model")
        job.log(f"resource estimate at reuse {est.reuse_factor}: {est.dsp} DSP, {est.bram36} BRAM36, "
                f"{est.lut} LUT, {est.ff} FF ({'fits' if est.fits else 'does NOT fit'} {job.board.id})")

        timing = fr.timing(costs, est.reuse_factor, fpga.fabric_clock_mhz, is_cnn)
        job.log(f"timing estimate at {fpga.fabric_clock_mhz:g} MHz: latency {timing['latency_cycles']} cycles "
                f"({timing['latency_us']} µs), a new input every {timing['interval_cycles']} cycles "
                f"({timing['interval_us']} µs)")
        dw = {c.name: c.reuse(est.reuse_factor) for c in costs if c.kernel}
        project = write_project(job, mw, iq, est.reuse_factor, is_cnn, dw)
        hm = project["hm"]
        wraps = wrap_risks(hm)
        if wraps:
            raise VerificationError(f"hls4ml left layers with a fixed precision that may wrap: {wraps}; "
                                    "every layer needs a precision inferred from its quantizer")

        table = next((n for n in mw.graph.node if n.op_type in fq.TABLE_ACTS), None)
        state = {"hm": hm, "mw": mw, "iq": iq, "cnn": is_cnn, "checked": 0, "first_mismatch": None, "perm": perm,
                 "table": {"node": table.name, "op": table.op_type, "tolerance": TABLE_TOL[table.op_type]}
                 if table is not None else None}
        self._compiled[str(job.out_dir)] = state
        x = fabric_input(state, calib[:CHECK_SAMPLES])
        ref, got = fq.qonnx_execute(mw, x), predict(state, x)
        require_exact(state, x, ref, got, f"{len(x)} calibration samples")
        job.log(f"C simulation bit-exact against QONNX execution on {len(x)} calibration samples")
        n = min(16, len(x))
        # the board's fabric runs the same HLS code as the C simulation: its outputs are the board's golden
        np.savez(job.out_dir / FABRIC_GOLDEN, input=x[:n].reshape(n, -1), output=got[:n].reshape(n, -1))

        # the HLS project goes into the bundle, without the host's compiled library
        shutil.copytree(job.work_dir / HLS_DIR, job.out_dir / HLS_DIR,
                        ignore=shutil.ignore_patterns("*.so", "*.o", "__pycache__"))
        resources = {"board": job.board.id, "part": fpga.part, "chosen": est.to_json(), "timing": timing,
                     "layers": [{"layer": c.name, "weights": c.weights, "weight_bits": c.w_bits,
                                 "reuse_factor": c.reuse(est.reuse_factor), "depthwise": bool(c.kernel)}
                                for c in costs],
                     "tried": [t.to_json() for t in tried], "fit_share": fr.FIT_SHARE,
                     "available": {"dsp": fpga.dsp, "bram36": fpga.bram36, "lut": fpga.lut, "ff": fpga.ff,
                                   "uram": fpga.uram},
                     "note": "ESTIMATE before synthesis; build.sh runs Vivado and writes the real utilization"}
        (job.out_dir / RESOURCES).write_text(json.dumps(resources, indent=2) + "\n")
        files = [PRIMARY, FABRIC_GOLDEN, RESOURCES] + sorted(
            p.relative_to(job.out_dir).as_posix() for p in (job.out_dir / HLS_DIR).rglob("*") if p.is_file())
        why = no_bitstream_reason()
        notes = [
            f"resource use is an ESTIMATE at reuse factor {est.reuse_factor}: {est.dsp} DSP, {est.bram36} BRAM36, "
            f"{est.lut} LUT of {job.board.id} ({fpga.dsp} DSP, {fpga.bram36} BRAM36, {fpga.lut} LUT); "
            "Vivado's report replaces it",
            f"no bitstream in this bundle: {why}; run ./build.sh where Vivado is installed, "
            "then python3 run.py on the board",
        ]
        if not fpga.hls4ml_board:
            notes.append(f"hls4ml has no {job.board.name} board: the bundle holds the bare HLS IP for part "
                         f"{fpga.part}; the block design (Zynq PS + AXI DMA) is built in Vivado (docs/fpga.md)")
        meta = {
            "backend": project["backend"], "part": fpga.part, "hls4ml_board": fpga.hls4ml_board, "project": PROJECT,
            "hls_dir": HLS_DIR, "io_type": project["io_type"],
            "reuse_factor": est.reuse_factor, "strategy": project["cfg"]["Model"]["Strategy"],
            "clock_mhz": fpga.fabric_clock_mhz,
            "quantization": {"tool": "brevitas graph-mode PTQ (FlexML power-of-two maps)", "weights_bits": bits, "activation_bits": bits,
                             "input_bits": iq["bits"], "scales": "power of two" if po2 else "float",
                             "bias": "Int32Bias (scale = input x weight scale)", "quant_nodes": quants,
                             "input_quant": iq, "calibration_samples": len(calib)},
            "layers": layers,
            "precisions": layer_precisions(hm),
            "bit_exact": state["bit_exact"],
            "table_check": state.get("table_check"),
            "csim_compile_s": round(project["compile_s"], 2),
            "resources_estimate": est.to_json(),
            "timing_estimate": {k: v for k, v in timing.items() if k != "layers"},
            "bitstream": {"built": False, "reason": why, "build_script": "build.sh"},
            "fabric_golden": FABRIC_GOLDEN,
        }
        return Artifact(format="hls4ml", precision=job.precision, primary=PRIMARY, files=files,
                        runtime=f"hls4ml {hls4ml.__version__} C simulation (g++), bit-exact vs qonnx", meta=meta,
                        notes=notes)

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        state = self._compiled.get(str(job.out_dir))
        if state is None:
            raise VerificationError("no compiled C simulation for this build: run convert() first in this process")
        name = job.model.inputs[0].name

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            x = feeds[name]
            if state.get("perm"):
                x = np.transpose(x, state["perm"])
            x = fabric_input(state, x)
            ref, got = fq.qonnx_execute(state["mw"], x), predict(state, x)
            require_exact(state, x, ref, got, "verification inputs")
            artifact.meta["bit_exact"] = state["bit_exact"]
            artifact.meta["table_check"] = state.get("table_check")
            return [got.reshape(ref.shape)]

        return run

    @staticmethod
    def versions() -> dict[str, str]:
        return toolchain_versions("torch", "onnx", "onnxruntime", "brevitas", "qonnx", "hls4ml")


CONVERTER = Hls4mlConverter()
