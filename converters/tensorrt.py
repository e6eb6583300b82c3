"""Jetson / TensorRT: a TensorRT-ready ONNX (fp32, fp16, or INT8 with explicit Q/DQ).

fp32   exported ONNX, cleaned with onnxslim.
fp16   weights stored as fp16 (onnxruntime's float16 converter), fp32 I/O kept; the
       engine is built with ``--fp16``.
int8   onnxruntime.quantization ``quantize_static`` in QDQ format: symmetric INT8,
       per-channel weights, activation ranges calibrated on the calibration set by the
       method that measures best on this model (``calibration=auto``: min-max, percentile
       99.999 / 99.99, entropy with TensorRT's bin settings and MSE, each model's output SNR
       against float on calibration samples), or the one given. Where the build fails
       verification, mixed precision (edgekit.mixed) leaves the fewest sensitive nodes out of
       Q/DQ. TensorRT reads the Q/DQ pairs directly (explicit quantization), so no
       calibrator runs on the board.

Where ``tensorrt`` imports and a GPU is present, the engine is built here too (with a
timing cache); otherwise the bundle's ``build_engine.sh`` builds it on the board.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import shutil
import time
from pathlib import Path

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner, load_firmware
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError
from edgekit.mixed import (Layer, Search, channel_energy, keep_layers, output_snr_db, quant_noise, search_feeds,
                           weight_sqnr_db)
from edgekit.mixed import db as mixed_db
from edgekit.onnx_graph import cap_ir_version, export_onnx, prune_opsets, slim, tensor_values, toposort
from edgekit.onnx_fuse import fold_pad_into_maxpool

PRIMARY = "model.onnx"


class TensorRTConverter:
    name = "tensorrt"

    def convert(self, job: ConvertJob) -> Artifact:
        onnx = require("onnx", "jetson")
        opset = job.opset or job.target.opset or 18
        if job.float_onnx is not None:
            raw = job.float_onnx  # exported once by the analyze stage, at this opset
        else:
            raw = export_onnx(job.model, job.work_dir / "exported.onnx", opset)
        job.log(f"float ONNX (opset {_opset(onnx.load(str(raw)))})")
        clean = job.work_dir / "float.onnx"
        stats = slim(raw, clean)
        job.log(f"onnxslim: {stats['nodes_before']} -> {stats['nodes_after']} nodes")
        proto = onnx.load(str(clean))
        if folded := fold_pad_into_maxpool(proto):  # -inf padding stops onnxruntime's INT8 calibrators
            onnx.save(proto, str(clean))
            stats["pads_folded_into_maxpool"] = folded
            job.log(f"{folded} Pad(-inf) -> MaxPool folded into the pools' own padding")
        dest = job.out_dir / PRIMARY
        meta: dict = {"opset": _opset(onnx.load(str(clean))), "graph_cleanup": {"tool": "onnxslim", **stats}}
        notes: list[str] = []
        if job.precision == "fp32":
            shutil.copyfile(clean, dest)
            meta["trtexec_flags"] = []
        elif job.precision == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            proto = convert_float_to_float16(onnx.load(str(clean)), keep_io_types=True)
            onnx.save(toposort(prune_opsets(proto)), str(dest))
            meta["trtexec_flags"] = ["--fp16"]
        elif job.precision == "int8":
            meta["quantization"] = self._quantize_int8(job, clean, dest)
            meta["trtexec_flags"] = ["--int8", "--fp16"]
        else:
            raise ConversionError(f"precision {job.precision!r} is not offered by the jetson target (fp32, fp16, int8)")
        meta["engine"] = self._maybe_build_engine(job, dest, notes)
        onnx.checker.check_model(str(dest))
        return Artifact(
            format="onnx",
            precision=job.precision,
            primary=PRIMARY,
            files=[PRIMARY] + (["model.engine", "timing.cache"] if meta["engine"]["built"] else []),
            runtime=f"onnxruntime {require('onnxruntime').__version__} (CPUExecutionProvider)",
            meta=meta,
            notes=notes,
        )

    def _quantize_int8(self, job: ConvertJob, src: Path, dest: Path) -> dict:
        onnx = require("onnx", "jetson")
        pre = _preprocessed(job, src)
        assert job.calib is not None  # the pipeline refuses int8 without calibration data
        feeds = list(job.calib.batches(job.model))
        excluded = list(job.options.get("keep_float_nodes") or [])
        placement = _placement(job)
        auto_equalize = str(job.options.get("equalize") or "off").lower() == "auto"  # on / off: decided now
        equalized = None if auto_equalize else self._equalize_before(job, pre, feeds)
        asked = job.options.get("calibration") or "auto"
        measured: dict[str, float] = {}
        if asked == "auto":  # each method's model against the float one on calibration samples: the best wins
            search = search_feeds(job)
            ref = _run(pre, search)
            histograms: dict = {}  # one |x| histogram collection for the methods that read it
            for name in CALIBRATIONS:
                cand = job.work_dir / f"int8-{name}.onnx"
                with job.substep(f"calibration ({name})"):
                    ranges = _ranges(job, pre, feeds, name, histograms)
                _qdq(pre, cand, ranges, name, excluded, placement)
                measured[name] = round(output_snr_db(ref, _run(cand, search)), 2)
            chosen = max(measured, key=lambda k: measured[k])
            job.log("calibration by measurement (output SNR against float on "
                    f"{sum(len(next(iter(f.values()))) for f in search)} calibration samples): "
                    + ", ".join(f"{k} {v:.1f} dB" for k, v in measured.items()) + f" -> {chosen}")
        else:
            chosen = asked
        with job.substep("calibration"):
            ranges = _ranges(job, pre, feeds, chosen)  # computed above where measured (cached)
        ranges, student = self._student_ranges(job, pre, feeds, ranges)
        _qdq(pre, dest, ranges, chosen, excluded, placement)
        if auto_equalize and student and student["applied"]:
            equalized = {"applied": False, "chosen": "default", "reason": "the fine-tuned student's activation "
                         "ranges are imposed: equalizing would give their tensors other values"}
        elif auto_equalize:
            equalized = self._equalize_if_better(job, pre, dest, feeds, chosen)
        bias = self._bias_correction(job, pre, dest, feeds)
        proto = prune_opsets(onnx.load(str(dest)))
        cap_ir_version(proto)
        onnx.save(proto, str(dest))
        n_q = sum(1 for n in proto.graph.node if n.op_type == "QuantizeLinear")
        n_dq = sum(1 for n in proto.graph.node if n.op_type == "DequantizeLinear")
        job.log(f"INT8 Q/DQ: {n_q} QuantizeLinear, {n_dq} DequantizeLinear, calibrated on {len(feeds)} batches")
        return {
            "tool": "onnxruntime.quantization.quantize_static",
            "format": "QDQ",
            "weights": "int8 symmetric per-channel",
            "activations": "int8 symmetric per-tensor",
            "qdq_placement": placement,
            "qdq_placement_is": ("inputs of " + ", ".join(TRT_QDQ_OPS) + " only (TensorRT's guidance; the rest "
                                 "runs fp16)") if placement == "tensorrt" else "every op onnxruntime quantizes",
            "calibration_method": chosen,
            "calibration_settings": CALIBRATIONS[chosen][1],
            "calibration_chosen": "by measurement (output SNR dB against float)" if measured else "by --option",
            "calibration_measured_snr_db": measured or None,
            "calibration_batches": len(feeds),
            "calibration_source": job.calib.source,
            "nodes_kept_float": excluded,
            **({"student_ranges": student} if student else {}),
            "depthwise_equalization": equalized,
            "bias_correction": bias,
            "quantize_linear": n_q,
            "dequantize_linear": n_dq,
        }

    @staticmethod
    def _equalized(job: ConvertJob, pre: Path, feeds: list) -> tuple[object | None, dict]:
        """Per-channel equalization of the tensors that feed a depthwise convolution from a convolution (through
        a ReLU or directly; onnx_fuse.equalize_depthwise_inputs): each such tensor's channels are made to span
        the same range before its per-tensor INT8 range is calibrated, the scales moved into the two layers'
        per-channel weights, where int8 rounds them as before. MobileNet-style nets feed a depthwise layer
        channels whose ranges differ 8-16x (ppocr-cls), and one per-tensor scale leaves the small ones a few
        levels. ``--option equalize=off`` (default: on ppocr-cls it lifts the plain build by 2 dB on 1000 held-out
        lines, and with its layer search the build ends worse, docs/finetune.md), ``on`` (_equalize_before:
        ``pre`` is equalized before calibration) or ``auto`` (_equalize_if_better). Where applied, bias
        correction, the mixed-precision search and its rebuilds (which repeat the decision as ``on`` / ``off``)
        build on the equalized model. The equalized model depends on the calibration data only, not on the nodes
        kept float. Returns the equalized model (None where the mode is off or there is no site) and the
        manifest's record."""
        onnx = require("onnx", "jetson")
        from edgekit.onnx_fuse import depthwise_input_sites, equalize_depthwise_inputs

        asked = str(job.options.get("equalize") or "off").lower()  # auto / on / off: TensorRTOptions checks
        chosen = "by --option" if job.options.get("equalize") else "default"
        if asked == "off":
            return None, {"applied": False, "chosen": chosen}
        proto = onnx.load(str(pre))
        sites = depthwise_input_sites(proto)
        if not sites:
            return None, {"applied": False, "chosen": chosen, "sites": 0,
                          "reason": "no convolution feeds a depthwise convolution (directly or through a ReLU)"}
        with job.substep("depthwise equalization"):
            ranges = _per_channel(pre, [s[2].input[0] for s in sites], feeds[:EQUALIZE_RANGE_BATCHES], "absmax")
            done = equalize_depthwise_inputs(proto, sites, ranges)
        job.log(f"depthwise equalization of {len(done)} input(s) (channel ranges spread up to "
                f"{max(d['spread'] for d in done):.1f}x)")
        return proto, {"applied": True, "chosen": chosen, "sites": len(done), "tensors": done}

    def _equalize_before(self, job: ConvertJob, pre: Path, feeds: list) -> dict:
        """``equalize=on`` / ``off``: ``pre`` equalized (in place) before calibration, as _equalized says."""
        onnx = require("onnx", "jetson")

        proto, record = self._equalized(job, pre, feeds)
        if proto is not None:
            onnx.save(proto, str(pre))
        return record

    def _equalize_if_better(self, job: ConvertJob, pre: Path, dest: Path, feeds: list, method: str) -> dict:
        """``equalize=auto``: the INT8 build ``dest`` is built again from the equalized model with the same
        calibration ``method`` and kept where the output SNR on up to EQUALIZE_SAMPLES calibration samples rises;
        then ``pre``, ``dest`` and the method's cached ranges are replaced."""
        onnx = require("onnx", "jetson")

        proto, record = self._equalized(job, pre, feeds)
        if proto is None:
            return record
        eq = job.work_dir / "equalized.onnx"
        onnx.save(proto, str(eq))
        with job.substep("depthwise equalization"):
            ranges = _ranges(job, eq, feeds, method, tag="equalized-")
            cand = job.work_dir / "int8-equalized.onnx"
            _qdq(eq, cand, ranges, method, list(job.options.get("keep_float_nodes") or []), _placement(job))
        # on twice the search's samples: ppocr-cls's gain (2.0 dB on 1000 held-out lines) measured -0.9 dB on the 32
        # search lines (one line's error dominates the sum) and +1.4 dB on all 59 calibration lines
        search = search_feeds(job, EQUALIZE_SAMPLES)
        ref = _run(pre, search)
        before, after = output_snr_db(ref, _run(dest, search)), output_snr_db(ref, _run(cand, search))
        apply = bool(after > before)
        job.log(f"depthwise equalization: output SNR {before:.1f} -> {after:.1f} dB on {len(search)} calibration "
                f"batches: {'applied' if apply else 'not applied'}")
        if apply:
            for stale in job.work_dir.glob("ranges-*.json"):  # other methods' ranges, of the model before
                if not stale.name.startswith("ranges-equalized-"):
                    stale.unlink()
            shutil.copyfile(eq, pre)
            shutil.copyfile(ranges, job.work_dir / f"ranges-{method}.json")
            shutil.copyfile(cand, dest)
        return {**record, "applied": apply, "chosen": "by measurement (output SNR dB)",
                "snr_db_before": round(before, 2), "snr_db_after": round(after, 2)}

    @staticmethod
    def _student_ranges(job: ConvertJob, pre: Path, feeds: list, ranges: Path) -> tuple[Path, dict | None]:
        """A .pt2 that edgekit finetune wrote for jetson, with ``--option student_ranges=on``: the activation ranges
        its student trained with, imposed over the calibrated ``ranges`` on the tensors of ``pre`` that hold the
        same values (edgekit.finetune.student_ranges), so the build computes what the student did. On ppocr-cls
        (1000 held-out lines) that lifts agreement with the original float model from 96.2% to 97.0% (the student's
        own), but the student's min/max ranges round more coarsely than convert's chosen method and one golden
        line's probability then strays by 0.30, past the 15% gate: off by default (docs/finetune.md). Returns the
        ranges to build with and the manifest's record (None for any other model)."""
        from edgekit.finetune import read_record, student_ranges

        asked = str(job.options.get("student_ranges") or "off").lower()  # on / off: TensorRTOptions checks
        if asked == "off":
            rec = read_record(job.model.source) if job.model.kind == "exported_program" else None
            if not isinstance(rec, dict) or not isinstance(rec.get("finetuned_from"), dict):
                return ranges, None
            return ranges, {"applied": False, "chosen": "by --option" if job.options.get("student_ranges")
                            else "default"}
        if not feeds:
            return ranges, None
        with job.substep("student ranges"):
            found = student_ranges(job.model, pre, feeds[0], TRT_QDQ_OPS)
        if found is None:
            return ranges, None
        record = {"points": found["points"], "matched": found["matched"], "chosen": "by --option"}
        if not found["ranges"]:
            why = found.get("reason", "no tensor holds the values of a student's quantized input")
            job.log(f"the fine-tuned student's activation ranges not imposed: {why}")
            return ranges, {**record, "applied": False, "reason": why}
        from onnxruntime.quantization.calibrate import TensorData, TensorsData, load_tensors_data, save_tensors_data

        data = load_tensors_data(str(ranges))
        table = dict(data.data)
        for t, (lo, hi) in found["ranges"].items():
            a = max(-min(lo, 0.0), max(hi, 0.0))  # symmetric, as the student froze it (finetune ActFQ.freeze)
            table[t] = TensorData(lowest=np.array([-a], np.float32), highest=np.array([a], np.float32))
        out = job.work_dir / f"student-{ranges.name}"
        save_tensors_data(TensorsData(data.calibration_method, table), out)
        job.log(f"the fine-tuned student's activation ranges imposed on {len(found['ranges'])} tensor(s) "
                f"({found['matched']} of its {found['points']} quantized inputs matched by value)")
        return out, {**record, "applied": True, "tensors": len(found["ranges"])}

    @staticmethod
    def _bias_correction(job: ConvertJob, pre: Path, dest: Path, feeds: list) -> dict:
        """Bias correction of the Q/DQ model ``dest`` (in place), kept only where it measures better: the shift
        that int8 rounding puts in each quantized convolution's / GEMM's output channels (its mean over the
        calibration samples, against the float model's) taken out of that layer's float bias, layer groups in
        graph order, each measured after the groups before it were corrected (NNCF's bias correction, on the
        ONNX graph). Depthwise convolutions with few weights per channel shift most. ``--option
        bias_correction=off`` (default), ``auto`` (applied if the output SNR on the search samples rises), ``on``."""
        asked = str(job.options.get("bias_correction") or "off").lower()  # auto / on / off: TensorRTOptions checks
        if asked == "off":
            return {"applied": False, "chosen": "by --option" if job.options.get("bias_correction") else "default"}
        cand = job.work_dir / "int8-bias-corrected.onnx"
        with job.substep("bias correction"):
            layers, batches = _correct_biases(pre, dest, cand, feeds)
        if not layers:
            return {"applied": False, "layers": 0, "reason": "no quantized conv / gemm with a bias to correct"}
        search = search_feeds(job)
        ref = _run(pre, search)
        before, after = output_snr_db(ref, _run(dest, search)), output_snr_db(ref, _run(cand, search))
        apply = bool(asked == "on" or after > before)
        job.log(f"bias correction of {layers} layer(s): output SNR {before:.1f} -> {after:.1f} dB on the search "
                f"samples: {'applied' if apply else 'not applied'}")
        if apply:
            shutil.copyfile(cand, dest)
        return {"applied": apply, "chosen": "by --option" if asked == "on" else "by measurement (output SNR dB)",
                "layers": layers, "snr_db_before": round(before, 2), "snr_db_after": round(after, 2),
                "batches": batches}

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        """The layers an INT8 build may keep out of quantization (TensorRT then runs them in fp16/fp32, as
        ``--int8 --fp16`` allows), ranked by the worse of their local quantization SQNR and the output SNR with
        only their rounding (_isolated_snr), and a builder for the search. The ranking measures at the output, so
        the search keeps the fewest ranked worst together (``by_rank``)."""
        onnx = require("onnx", "jetson")
        from onnx import helper

        pre = job.work_dir / "preprocessed.onnx"
        method = artifact.meta["quantization"]["calibration_method"]
        placement = _placement(job)
        quantized = set(TRT_QDQ_OPS) if placement == "tensorrt" else QUANTIZED_OPS
        base_excluded = list(job.options.get("keep_float_nodes") or [])
        ranges_path = _ranges(job, pre, list(job.calib.batches(job.model)), method)
        ranges = require("onnxruntime.quantization.calibrate", "jetson").load_tensors_data(ranges_path)
        search = search_feeds(job)
        proto = onnx.load(str(pre))
        inits = {i.name: i for i in proto.graph.initializer}
        nodes = [n for n in proto.graph.node if n.op_type in quantized and n.name not in base_excluded]

        def rounded(n) -> list[str]:  # the tensors a node's Q/DQ rounds: its activation inputs, or its output
            if placement == "tensorrt":
                return [t for t in n.input[:2] if t and t not in inits]
            return [n.output[0]] if n.output else []

        # one float run that also returns every node's output: its local INT8 SQNR at the calibrated range
        wanted = [t for n in nodes for t in rounded(n) if t in ranges.data]
        wanted += [t for n in nodes if n.op_type in WEIGHTED and n.input and n.input[0] not in inits
                   for t in (n.input[0], n.output[0])]
        wanted = list(dict.fromkeys(wanted))
        vi = {v.name: v for v in list(proto.graph.value_info) + list(proto.graph.output)}
        known = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}  # inputs come from the feeds
        for t in wanted:
            if t not in known:
                proto.graph.output.append(vi.get(t) or helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
        aug = job.work_dir / "mixed-augmented.onnx"
        onnx.save(proto, str(aug))
        import onnxruntime as ort

        sess = ort.InferenceSession(str(aug), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        # statistics summed batch by batch (a detector's every activation at once would not fit in memory)
        act = {n.name: [0.0, 0.0] for n in nodes}
        energy: dict[str, list] = {}
        for f in search[:8]:
            vals = {**f, **dict(zip(names, sess.run(names, f), strict=True))}
            for n in nodes:
                for t in rounded(n):
                    if t in vals and t in ranges.data:
                        lo, hi = ranges.data[t].range_value
                        sig, noise = quant_noise(vals[t], float(np.max(np.abs([lo, hi]))))
                        act[n.name][0] += sig
                        act[n.name][1] += noise
                if n.op_type in WEIGHTED:
                    for t in (n.input[0], n.output[0]):
                        if t in vals and np.ndim(vals[t]) >= 2:
                            x = vals[t]
                            x = x.reshape(-1, x.shape[-1]) if n.op_type in ("Gemm", "MatMul") else x
                            e, c = channel_energy(x)
                            acc = energy.setdefault(t, [np.zeros_like(e), 0])
                            if acc[0].shape == e.shape:
                                acc[0] += e
                                acc[1] += c
            del vals
        layers = []
        for n in nodes:
            scores = [mixed_db(*act[n.name])] if act[n.name] != [0.0, 0.0] else []
            w = next((inits[i] for i in n.input[1:2] if i in inits), None)
            if w is not None and n.op_type in WEIGHTED and n.input[0] in energy and n.output[0] in energy:
                arr = onnx.numpy_helper.to_array(w)
                groups = next((a.i for a in n.attribute if a.name == "group"), 1)
                if n.op_type == "ConvTranspose":
                    arr = None  # its weight is [in, out/groups, ...]: not ranked by weights
                elif n.op_type == "MatMul" or (n.op_type == "Gemm" and not any(
                        a.name == "transB" and a.i for a in n.attribute)):
                    arr = arr.T if arr.ndim == 2 else None  # [in, out] -> [out, in]
                e_in, e_out = energy[n.input[0]], energy[n.output[0]]
                if arr is not None and e_in[1] and e_out[1] and arr.shape[1] * groups == len(e_in[0]):
                    scores.append(weight_sqnr_db(arr, e_in[0] / e_in[1], float(np.sum(e_out[0] / e_out[1])), groups))
            if scores:
                layers.append(Layer(n.name, n.op_type, round(float(min(scores)), 2)))
        ref = _run(pre, search)
        # and by what its rounding costs the output alone, through the layers after it (the worse of the two)
        full = job.work_dir / "mixed-all.onnx"
        _qdq(pre, full, ranges_path, method, base_excluded, placement)
        t0 = time.perf_counter()
        alone = _isolated_snr(pre, full, [lay.name for lay in sorted(layers, key=lambda x: x.local_sqnr_db)],
                              search, ref, job.work_dir)  # the locally worst first, where the budget ends early
        full.unlink()
        job.log(f"each node's rounding alone measured at the output: {len(alone)} of {len(layers)} nodes in "
                f"{time.perf_counter() - t0:.1f} s")
        for lay in layers:
            if np.isfinite(alone.get(lay.name, np.inf)):
                lay.local_sqnr_db = round(float(min(lay.local_sqnr_db, alone[lay.name])), 2)
        step = iter(range(10**6))

        def outputs(kept: list[str]) -> list[np.ndarray]:
            cand = job.work_dir / f"mixed-{next(step)}.onnx"
            _qdq(pre, cand, ranges_path, method, base_excluded + kept, placement)
            got = _run(cand, search)
            cand.unlink()
            return got

        return Search(layers, outputs, ref, "float (left out of Q/DQ; TensorRT runs it in fp16 under --fp16)",
                      by_rank=bool(alone))

    keep_layers = keep_layers  # the INT8 build again with the kept nodes left out of Q/DQ (edgekit.mixed)

    def _maybe_build_engine(self, job: ConvertJob, onnx_path: Path, notes: list[str]) -> dict:
        why = _engine_unavailable()
        if why:
            where = ("install TensorRT on this machine (the board) and run build_engine.sh"
                     if job.board.id == "host/host" else "run build_engine.sh on the board")
            notes.append(f"TensorRT engine not built here ({why}); {where}")
            return {"built": False, "reason": why, "build_script": "build_engine.sh"}
        runner = load_firmware("tensorrt")
        engine = job.out_dir / "model.engine"
        runner.build_engine(str(onnx_path), str(engine), job.precision,
                            timing_cache=str(job.out_dir / "timing.cache"), log=job.log)
        import tensorrt as trt

        notes.append(f"TensorRT {trt.__version__} engine built on this machine; it runs only on the same GPU model "
                     "and TensorRT version — the board rebuilds its own with build_engine.sh")
        return {"built": True, "tensorrt": trt.__version__, "file": "model.engine"}

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        # the bundle's own onnxruntime runner (firmware/tensorrt/run.py): the host verifies with
        # the session settings the board's onnxruntime fallback uses
        require("onnxruntime", "jetson")
        model = load_firmware("tensorrt").OnnxRuntimeModel(str(job.out_dir / artifact.primary))
        if len(model.options) > 1:  # recorded in the manifest's warnings: the board's runner retries the same way
            job.warn(f"onnxruntime needed session options {'; '.join(model.options)} to load the artifact")

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return list(model(feeds))

        return run

    @staticmethod
    def versions() -> dict[str, str]:
        return toolchain_versions("torch", "onnx", "onnxruntime", "onnxslim", "onnxscript", "tensorrt")


# ``--option calibration=``: name -> (onnxruntime CalibrationMethod, the calibrator's settings, really passed).
# Entropy: 2048 histogram bins searched for the KL-optimal threshold over 128 quantized bins (TensorRT's
# settings; quantize_static's own path leaves num_bins at 128, where entropy equals min-max).
# onnxruntime's "Distribution" method is for float8 (its int8 range is the histogram's full range: min-max).
CALIBRATIONS: dict[str, tuple[str, dict]] = {
    "minmax": ("MinMax", {}),
    "percentile": ("Percentile", {"percentile": 99.999, "num_bins": 2048}),
    "percentile-99.99": ("Percentile", {"percentile": 99.99, "num_bins": 2048}),
    "entropy": ("Entropy", {"num_bins": 2048, "num_quantized_bins": 128}),
    # the range whose int8 rounding + clipping error over the histogram is least (pytorch-quantization's "mse",
    # PT2E's HistogramObserver): onnxruntime collects the |x| histogram, edgekit's _mse_thresholds picks the range
    "mse": ("Percentile", {"num_bins": 2048}),
}
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# ``--option qdq=``: where the Q/DQ pairs go.
# "tensorrt" (default): TensorRT's own placement guidance, as NVIDIA ModelOpt's ONNX PTQ does it: Q/DQ on the
#   *inputs* of the layers TensorRT runs in INT8 (convolutions, GEMM/MatMul, average pooling), none on their
#   outputs, float biases; everything else (normalization written as ops, Sigmoid/Softmax, Add/Mul, LSTM state
#   arithmetic) is left to TensorRT's fp16 under --int8 --fp16. A Q/DQ on an output or on a pointwise op only
#   adds rounding TensorRT would otherwise not do: openWakeWord's "hey jarvis" head (LayerNorm as ReduceMean/Sub/
#   Pow/Sqrt/Div) moved a 0.15 score to 0.43 with it.
# "all": onnxruntime's default (every op it has a QDQ rule for, inputs and outputs): the earlier behaviour.
TRT_QDQ_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "AveragePool", "GlobalAveragePool")
# ops whose nodes quantize_static gives Q/DQ under "all" and that mixed precision may keep float
QUANTIZED_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "Concat", "AveragePool",
                 "GlobalAveragePool", "MaxPool", "Resize", "Sigmoid", "Softmax", "LeakyRelu", "HardSwish",
                 "Where", "Split", "Pad", "ReduceMean", "InstanceNormalization", "LayerNormalization", "Gather"}


def _placement(job: ConvertJob) -> str:
    return job.options.get("qdq") or "tensorrt"  # validated by converters.TensorRTOptions (pipeline.convert)


def _preprocessed(job: ConvertJob, src: Path) -> Path:
    """onnxruntime's quantization pre-processing (shape inference, BASIC optimization), every node named
    (nodes_to_exclude and the mixed-precision search address nodes by name)."""
    onnx = require("onnx", "jetson")
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = job.work_dir / "preprocessed.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    proto = onnx.load(str(pre))
    seen: set[str] = set()
    for i, n in enumerate(proto.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.op_type}_{i}"
        seen.add(n.name)
    onnx.save(proto, str(pre))
    return pre


def _run(path: Path, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    from edgekit.verify import run_all

    return run_all(load_firmware("tensorrt").OnnxRuntimeModel(str(path)), feeds)


def _per_channel(model, names: list[str], feeds: list, stat: str) -> dict[str, np.ndarray]:
    """Per tensor named in ``model`` (an ONNX path or proto), a statistic per channel (axis 1 of each value) over
    ``feeds``: ``mean`` (bias correction: int8 against float per output channel) or ``absmax``, the largest |x|
    (depthwise equalization's channel ranges)."""
    run = tensor_values(model, names)
    acc: dict[str, np.ndarray] = {}
    count: dict[str, int] = {}
    for f in feeds:
        for name, o in run(f).items():
            o = np.asarray(o, np.float64)
            axes = tuple(a for a in range(o.ndim) if a != 1) if o.ndim > 2 else (0,)  # all but the channel axis
            if stat == "mean":
                acc[name] = acc.get(name, 0) + o.sum(axis=axes)
                count[name] = count.get(name, 0) + int(np.prod([o.shape[a] for a in axes]))
            else:
                top = np.abs(o).max(axis=axes)
                acc[name] = np.maximum(acc[name], top) if name in acc else top
    return {name: v / max(1, count[name]) for name, v in acc.items()} if stat == "mean" else acc


def _ranges(job: ConvertJob, pre: Path, feeds: list, name: str, histograms: dict | None = None,
            tag: str = "") -> Path:
    """Activation ranges of ``pre`` by calibration method ``name`` with its settings, computed once per build
    (cached in the work folder as onnxruntime's calibration cache). ``histograms``: a dict kept by the caller
    across methods, where the |x| histograms collected once serve every method that reads them (percentile,
    percentile-99.99, mse: 2048 bins each), instead of one calibration pass per method. ``tag``: another model
    than the build's preprocessed one, cached apart."""
    cache = job.work_dir / f"ranges-{tag}{name}.json"
    if cache.is_file():
        return cache
    from onnxruntime.quantization.calibrate import (CalibrationMethod, TensorsData, create_calibrator,
                                                    save_tensors_data)

    method, settings = CALIBRATIONS[name]

    class Reader:
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    shared = method == "Percentile" and histograms is not None
    with contextlib.redirect_stdout(io.StringIO()):
        collector = histograms.get("percentile") if shared else None
        if collector is None:
            cal = create_calibrator(pre, None, augmented_model_path=str(job.work_dir / f"augmented-{tag}{name}.onnx"),
                                    calibrate_method=getattr(CalibrationMethod, method),
                                    extra_options={"symmetric": True, **settings})
            cal.collect_data(Reader())
            if method != "Percentile":
                save_tensors_data(cal.compute_data(), cache)
                return cache
            # only the histograms are kept for the other methods: a kept calibrator (its session of the
            # all-outputs model) doubled ppocr-rec's peak memory to the machine's 24 GB at the next collection
            collector = cal.collector
            del cal
            gc.collect()
            if shared:
                histograms["percentile"] = collector
        if name == "mse":  # the percentile collector's |x| histograms, edgekit's threshold rule
            result = _mse_thresholds(collector.histogram_dict)
        else:
            collector.percentile = settings["percentile"]
            result = collector.compute_percentile()
        save_tensors_data(TensorsData(CalibrationMethod.Percentile, result), cache)
    return cache


def _mse_thresholds(histograms: dict, levels: int = 127, candidates: int = 256) -> dict:
    """Per tensor, the symmetric int8 range ``±t`` that minimises the squared error of quantizing the values of
    its |x| histogram (each bin at its centre: rounding inside the range, clipping beyond it), over ``candidates``
    thresholds from 1/candidates of the largest |x| to all of it. onnxruntime's percentile collector's histograms
    in, its compute_percentile's result format out: {tensor: (-t, t, hist, edges)}."""
    out = {}
    for tensor, (hist, edges, lo, hi) in histograms.items():
        h = np.asarray(hist, np.float64)
        c = (np.asarray(edges[:-1], np.float64) + np.asarray(edges[1:], np.float64)) / 2
        top = float(edges[-1])
        if top <= 0 or h.sum() == 0:
            t = np.array(top, dtype=edges.dtype)
        else:
            ts = top * np.arange(1, candidates + 1) / candidates
            s = ts[:, None] / levels
            err = ((np.minimum(np.round(c[None, :] / s), levels) * s - c[None, :]) ** 2 * h[None, :]).sum(axis=1)
            t = np.array(ts[int(np.argmin(err))], dtype=edges.dtype)
        out[tensor] = (-t, t, hist, edges)
    return out


def _qdq(pre: Path, dest: Path, ranges: Path, name: str, excluded: list[str], placement: str) -> None:
    q = require("onnxruntime.quantization", "jetson")
    extra: dict = {"ActivationSymmetric": True, "WeightSymmetric": True}
    kw: dict = {}
    if placement == "tensorrt":
        kw["op_types_to_quantize"] = list(TRT_QDQ_OPS)
        extra.update(OpTypesToExcludeOutputQuantization=list(TRT_QDQ_OPS), QuantizeBias=False, DedicatedQDQPair=True)
    with contextlib.redirect_stdout(io.StringIO()):
        q.quantize_static(
            str(pre), str(dest), None,
            quant_format=q.QuantFormat.QDQ,
            activation_type=q.QuantType.QInt8,  # TensorRT takes symmetric signed INT8 only
            weight_type=q.QuantType.QInt8,
            per_channel=True,
            calibrate_method=getattr(q.CalibrationMethod, CALIBRATIONS[name][0]),
            calibration_cache_path=str(ranges),
            nodes_to_exclude=excluded,
            extra_options=extra,
            **kw,
        )


EQUALIZE_RANGE_BATCHES = 64  # calibration batches whose largest |x| per channel sets the equalization scales
EQUALIZE_SAMPLES = 64  # calibration samples on which equalize=auto measures the equalized build against the plain
ISOLATED_BUDGET_S = 60.0  # the mixed search's measure of each node's rounding alone, at most this long
BIAS_CORRECTION_BATCHES = 64  # calibration batches whose per-channel means correct the biases, at most ...
BIAS_CORRECTION_WORK = 5e7  # ... and layers x batches x input values per batch at most (8 batches at least): a deep
# model with large inputs (a 416 x 416 detector) measures fewer batches
BIAS_CORRECTION_GROUPS = 128  # sequential measurement rounds at most; more layers are corrected in groups of
# consecutive layers (a later layer of a group is measured before the earlier ones are corrected: auto measures)


def _bias_batches(available: int, layers: int, values: int) -> int:
    """How many calibration batches bias correction measures (``values``: input values in one batch)."""
    return int(min(available, BIAS_CORRECTION_BATCHES, max(8, BIAS_CORRECTION_WORK // max(1, layers * values))))


def _batch_values(feed: dict) -> int:
    return int(sum(np.asarray(v).size for v in feed.values()))


def _isolated_snr(pre: Path, full: Path, nodes: list[str], search: list, ref: list[np.ndarray], work: Path,
                  budget_s: float = ISOLATED_BUDGET_S) -> dict[str, float]:
    """Per node named in ``nodes``: the output SNR against float (dB) on ``search`` of the INT8 build ``full`` with
    only that node's inputs rounded (its activations at their calibrated ranges, its int8 weights), every other
    node reading the float values its Q/DQ pairs stand for (``pre``'s inputs of the node of the same name). It
    sees what a node's rounding costs the output through the layers after it, which its local SQNR does not: a
    first convolution's input rounding, amplified downstream (the jetson analogue of the 16x8 search's
    weight effect, converters/tflite.py). Nodes are measured in the order given until ``budget_s`` is spent (one
    onnxruntime session and run each: ppocr-cls, 64 nodes in 9 s); the rest are left out of the result."""
    onnx = require("onnx", "jetson")

    proto = onnx.load(str(full))
    base = onnx.load(str(pre))
    originals = {n.name: list(n.input) for n in base.graph.node}
    dequantized = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    have = {i.name for i in proto.graph.initializer}
    floats = {i.name: i for i in base.graph.initializer if i.name not in have}  # the weights Q/DQ replaced
    rewire = {}  # node index -> its inputs with each dequantized one replaced by the float tensor it stands for
    for k, n in enumerate(proto.graph.node):
        orig = originals.get(n.name)
        if orig is not None and len(orig) == len(n.input) and any(t in dequantized for t in n.input):
            rewire[k] = [o if t in dequantized else t for t, o in zip(n.input, orig, strict=True)]
    index = {n.name: k for k, n in enumerate(proto.graph.node) if k in rewire}
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for name in nodes:
        k = index.get(name)
        if k is None:
            continue
        if time.perf_counter() - t0 > budget_s:
            break
        iso = onnx.ModelProto()
        iso.CopyFrom(proto)
        for j, inputs in rewire.items():
            if j != k:
                del iso.graph.node[j].input[:]
                iso.graph.node[j].input.extend(inputs)
                iso.graph.initializer.extend(floats[t] for t in inputs if t in floats)
        cand = work / "mixed-isolated.onnx"
        onnx.save(iso, str(cand))
        out[name] = output_snr_db(ref, _run(cand, search))
        cand.unlink()
    return out


def _correct_biases(pre: Path, qdq: Path, dest: Path, feeds: list) -> tuple[int, int]:
    """Write ``qdq`` with each quantized Conv / Gemm's bias corrected to ``dest``; returns how many were corrected
    and on how many calibration batches.
    The correction of a layer is the mean, per output channel, of (int8 model - float model) at its output over
    ``feeds``, measured with every earlier group already corrected, and subtracted from its bias (a Conv without
    one gets one). Layers are taken in graph order, in at most BIAS_CORRECTION_GROUPS groups."""
    onnx = require("onnx", "jetson")
    from onnx import numpy_helper

    q = onnx.load(str(qdq))
    inits = {i.name: i for i in q.graph.initializer}
    made_by = {o: n for n in q.graph.node for o in n.output}

    def quantized_weight(n) -> bool:  # its weight is a DequantizeLinear of an int8 initializer
        w = made_by.get(n.input[1]) if len(n.input) > 1 else None
        return w is not None and w.op_type == "DequantizeLinear" and w.input[0] in inits

    uses: dict[str, int] = {}
    for n in q.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1

    def own_float_bias(n) -> bool:  # a float bias initializer of its own (or none, for a Conv: one is added)
        if len(n.input) > 2 and n.input[2]:
            return n.input[2] in inits and uses[n.input[2]] == 1
        return n.op_type == "Conv"

    # the layer's output must exist in the float model under the same name, to be compared
    fp = onnx.load(str(pre))
    float_names = {o for n in fp.graph.node for o in n.output}
    layers = [n for n in q.graph.node if n.op_type in ("Conv", "Gemm") and quantized_weight(n) and own_float_bias(n)
              and n.output[0] in float_names]
    if not layers:
        return 0, 0
    k = _bias_batches(len(feeds), len(layers), _batch_values(feeds[0]))
    feeds = [feeds[i] for i in np.linspace(0, len(feeds) - 1, k).astype(int)] if k < len(feeds) else feeds

    ref = _per_channel(fp, [n.output[0] for n in layers], feeds, "mean")
    size = -(-len(layers) // BIAS_CORRECTION_GROUPS)
    done = 0
    for g in range(0, len(layers), size):
        group = layers[g:g + size]
        got = _per_channel(q, [n.output[0] for n in group], feeds, "mean")
        for n in group:
            shift = got[n.output[0]] - ref[n.output[0]]
            if not np.all(np.isfinite(shift)):
                continue
            if len(n.input) > 2 and n.input[2]:
                b = inits[n.input[2]]
                old = numpy_helper.to_array(b)
                if old.size != shift.size:  # a broadcast Gemm bias: left as it is
                    continue
                new = (old.astype(np.float64) - shift.reshape(old.shape)).astype(old.dtype)
                b.CopyFrom(numpy_helper.from_array(new, b.name))
            else:
                name = f"{n.name or n.output[0]}_bias_corrected"
                t = numpy_helper.from_array((-shift.reshape(-1)).astype(np.float32), name)
                q.graph.initializer.append(t)
                inits[name] = q.graph.initializer[-1]
                n.input.append(name)
            done += 1
    onnx.save(q, str(dest))
    return done, len(feeds)


def _opset(proto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def _engine_unavailable() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    try:
        import tensorrt as trt

        builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
        if builder is None:
            return "TensorRT found no GPU"
    except Exception as exc:  # no GPU, no driver, missing libnvinfer
        return f"TensorRT cannot start: {type(exc).__name__}: {str(exc)[:120]}"
    return None


CONVERTER = TensorRTConverter()
