"""iOS / Core ML: an ML program (``.mlpackage``) converted with coremltools.

Route: torch.export ExportedProgram -> ``run_decompositions({})`` -> ``coremltools.convert``
(TorchScript ``torch.jit.trace`` only as a fallback when torch.export refuses the model).
The deployment target comes from the board's ``min_ios``; a precision that needs a newer
iOS than the board's is refused with the fix (``--set min_ios=N``) rather than raised
silently (coremltools would silently lift an iOS 15 model to iOS 16 when compressing).

Precisions (compression through ``coremltools.optimize.coreml``, applied to the fp16
program; weights below ``weight_threshold`` elements stay fp16):

============ ============================================================ =======
precision    what                                                         min iOS
============ ============================================================ =======
fp32         fp32 compute (runs on GPU/CPU: the ANE computes in fp16 only)   15
fp16         fp16 compute, fp32 inputs/outputs (default)                     15
int8-weight  ``linear_quantize_weights``: int8 symmetric per-channel         16
int6-weight  ``palettize_weights``: 6-bit k-means LUT per tensor             16
int4-weight  ``palettize_weights``: 4-bit k-means LUT per tensor             16
prune-50     ``prune_weights``: magnitude, 50 % sparsity, fp16 non-zeros     16
int8         W8A8: ``linear_quantize_activations`` on --calib + int8         17
             weights; the calibration runs Core ML predict: macOS only
============ ============================================================ =======

"4-bit weights" on Core ML means palettization: a 16-entry k-means look-up table per
tensor keeps accuracy better than a uniform int4 grid and runs from iOS 16 (linear int4
needs iOS 18), so ``int4-weight`` maps onto it; ``int6-weight`` is the 6-bit variant.

On Linux, verification runs the package's decompressed MIL program in torch
(:mod:`edgekit.converters.coreml_mil`); on macOS it runs Core ML ``predict``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError, HostCannotError, ProfileError, UnsupportedOpError
from edgekit.mixed import Layer, Search, keep_layers, search_feeds
from edgekit.mixed import db as mixed_db

PRIMARY = "model.mlpackage"
EXTRA = "ios"
WEIGHT_THRESHOLD = 2048  # coremltools' default: smaller tensors are not worth compressing


@dataclass(frozen=True)
class Compression:
    method: str | None  # None | linear | palettize | prune | w8a8
    bits: float  # storage bits per compressed weight element (incl. mask for pruning)
    min_ios: int
    describe: str


COMPRESSIONS: dict[str, Compression] = {
    "fp32": Compression(None, 32, 15, "fp32 weights and compute"),
    "fp16": Compression(None, 16, 15, "fp16 weights and compute, fp32 I/O"),
    "int8-weight": Compression("linear", 8, 16, "int8 symmetric per-channel weights (linear_quantize_weights)"),
    "int6-weight": Compression("palettize", 6, 16, "6-bit k-means palettized weights (per-tensor LUT)"),
    "int4-weight": Compression("palettize", 4, 16, "4-bit k-means palettized weights (per-tensor LUT)"),
    "prune-50": Compression("prune", 9, 16, "50% magnitude-pruned weights: 1-bit mask + fp16 non-zeros"),
    "int8": Compression("w8a8", 8, 17, "W8A8: int8 activations calibrated with Core ML predict + int8 weights"),
}


def _ct():
    ct = require("coremltools", EXTRA)
    _lstm_for_torch_export()
    return ct


def _lstm_for_torch_export() -> None:
    """coremltools' torch.export frontend looks an op up by its overload's name: aten.lstm.input as
    ``lstm.input``, which coremltools 9 leaves unregistered, so every LSTM model failed there ("cannot convert
    op aten.lstm.input"). Its ``lstm`` converter, written for TorchScript's aten::lstm, reads the same schema
    (input, hx[], params[], has_biases, num_layers, dropout, train, bidirectional, batch_first) but names one
    output per result, where a torch.export node has one output, the tuple its ``getitem`` users index (the
    final state: ``_, (h, c) = lstm(x)``). Registered under that name, with its three results bound as that
    tuple, torch.export programs with LSTMs convert (exact to 1.5e-8 on a 2-layer LSTM), and so do their PT2E
    W8A8 versions, which the TorchScript frontend cannot read."""
    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    if _TORCH_OPS_REGISTRY.get_func("lstm.input") is not None:
        return

    def lstm_input(context, node):
        names, saved = [f"{node.name}__result{i}" for i in range(3)], node.outputs
        node.outputs = names
        try:
            ops.lstm(context, node)
        finally:
            node.outputs = saved
        context.add(tuple(context[n] for n in names), node.name)

    _TORCH_OPS_REGISTRY.set_func_by_name(lstm_input, "lstm.input")


def deployment_target(job: ConvertJob) -> int:
    comp = COMPRESSIONS[job.precision]
    board_ios = job.board.min_ios
    if board_ios is None:
        raise ProfileError(f"board {job.board.id} has no min_ios; give it with --set min_ios=17")
    if board_ios < comp.min_ios:
        raise ProfileError(
            f"precision {job.precision} needs Core ML for iOS {comp.min_ios}+, but board {job.board.id} "
            f"targets iOS {board_ios}; raise it with --set min_ios={comp.min_ios} (drops older devices) "
            f"or choose fp16"
        )
    if board_ios > 18:
        return 18  # the newest target coremltools 9 writes; newer iOS run iOS 18 programs
    return board_ios


class CoreMLConverter:
    name = "coreml"

    def convert(self, job: ConvertJob) -> Artifact:
        ct = _ct()
        if job.precision not in COMPRESSIONS:
            raise ConversionError(f"precision {job.precision!r} is not offered by Core ML; one of {list(COMPRESSIONS)}")
        comp = COMPRESSIONS[job.precision]
        ios = deployment_target(job)
        t0 = time.perf_counter()
        w8a8_torch = None  # W8A8 calibrated in torch (PT2E) where Core ML predict is missing (Linux)
        if comp.method == "w8a8" and sys.platform != "darwin":
            w8a8_torch = self._pt2e_w8a8(job)
        with job.substep("MIL conversion"):
            mlmodel, source_route = self._convert_torch(job, ct, ios, quantized=w8a8_torch)
        kept_fp32: dict[str, str] = {}
        if w8a8_torch is not None:  # weights already int8 (constexpr_affine_dequantize): nothing left to compress
            comp = Compression("linear", 8, ios, "W8A8: int8 per-channel weights and int8 per-tensor activations, "
                                                 f"calibrated in torch (PT2E, {w8a8_torch['observer']} observer) "
                                                 "on --calib")
            given = job.options.get("fp32_ops")  # a mixed-precision rebuild: the first build's, as measured there
            if given is not None:
                kept_fp32 = dict(given)
            elif not fp16_fits(job, mlmodel, w8a8=True):
                # a power spectrum beyond fp16 (oww-melspec), an LSTM state that fp16 storage moves (silero-vad:
                # its states 88% off with every layer fp16): the same measured choice as an fp16 build, against
                # the W8A8 program computed in fp32 (its int8 error is the search's and verification's to judge)
                m32, source_route = self._convert_torch(job, ct, ios, force_fp32=True, quantized=w8a8_torch)
                kept_fp32 = fp16_keep(job, m32, w8a8=True)
            if kept_fp32:
                keep = frozenset(kept_fp32)
                job.log(f"W8A8: {len(kept_fp32)} op(s) kept fp32 (fp16 moves the outputs too far, or their values "
                        "pass its range): " + "; ".join(f"{k}: {v}" for k, v in list(kept_fp32.items())[:4]))
                # converted again from the torch program (a converted program's int8 weights do not survive a
                # second conversion); the fp16 pass meets the same op names as the fp32 conversion measured
                mlmodel, source_route = self._convert_torch(
                    job, ct, ios, quantized=w8a8_torch,
                    precision=ct.transform.FP16ComputePrecision(op_selector=lambda op: op.name not in keep))
        elif job.precision != "fp32" and not fp16_fits(job, mlmodel):
            # some values exceed fp16's range, or fp16 storage moves the outputs too far: convert at fp32 (stable op
            # names), choose by measurement the fewest ops to leave in fp32, and run coremltools' fp16 pass on that
            # program with those ops left in fp32
            m32, source_route = self._convert_torch(job, ct, ios, force_fp32=True)
            kept_fp32 = fp16_keep(job, m32)
            keep = frozenset(kept_fp32)
            job.log(f"fp16: {len(kept_fp32)} op(s) kept fp32: "
                    + "; ".join(f"{k}: {v}" for k, v in list(kept_fp32.items())[:4]))
            mlmodel = ct.convert(m32._mil_program, convert_to="mlprogram", minimum_deployment_target=getattr(
                ct.target, f"iOS{ios}"), compute_precision=ct.transform.FP16ComputePrecision(
                op_selector=lambda op: op.name not in keep))
        t_convert = time.perf_counter() - t0
        job.log(f"coremltools {ct.__version__}: ML program for iOS {ios} via {source_route} in {t_convert:.2f} s")
        t1 = time.perf_counter()
        threshold = int(job.options.get("weight_threshold") or WEIGHT_THRESHOLD)
        if w8a8_torch is not None:
            threshold = 1  # PT2E quantizes every conv / linear weight, whatever its size
        else:
            mlmodel = self._compress(job, mlmodel, comp, threshold)
        t_compress = time.perf_counter() - t1
        if comp.method:
            job.log(f"{job.precision}: {comp.describe} in {t_compress:.2f} s")
        _describe(mlmodel, job)
        dest = job.out_dir / PRIMARY
        mlmodel.save(str(dest))
        checks = linux_checks(job, dest, comp, threshold, mixed=bool(kept_fp32),
                              consumers=W8A8_CONSUMERS if w8a8_torch is not None else None,
                              kept_layers=len(w8a8_torch["kept"]) if w8a8_torch is not None else 0)
        w = checks["weights"]
        job.log(f"package: weight.bin {w['measured_bytes']:,} B ({w['expected_bytes']:,} B of {job.precision} weights "
                f"and biases, + headers), {sum(checks['op_counts'].values())} MIL ops")
        for flag in checks["ane_flags"]:
            job.warn(f"Neural Engine: {flag}")
        files = sorted(p.relative_to(job.out_dir).as_posix() for p in dest.rglob("*") if p.is_file())
        notes = [
            "Linux checks (no Core ML here): the spec loads; input/output names, shapes and types match the source "
            "model; MIL op list recorded; weight-file bytes match the requested compression; ops known to keep the "
            "model off the Neural Engine flagged "
            f"({len(checks['ane_flags'])} found).",
        ]
        notes.append(  # one fp32 figure, the analysis' own: every float weight and bias at 4 bytes
            f"weight file {w['measured_bytes']:,} B for {w['fp32_bytes']:,} B of weights and biases at fp32"
            + (f" ({w['measured_bytes'] / w['fp32_bytes']:.3f}x)" if w["fp32_bytes"] else "")
            + (f"; the {w['compressed_tensors']} compressed tensors take {w['compressed_ratio_vs_fp32']:.3f}x "
               f"of fp32 ({comp.describe})" if w["compressed_ratio_vs_fp32"] else "")
            + f"; conversion {t_convert:.2f} s, compression {t_compress:.2f} s"
        )
        if kept_fp32:
            notes.append(f"{len(kept_fp32)} op(s) computed in fp32 inside the fp16 program, chosen by measurement on "
                         "the calibration inputs: " + "; ".join(f"{k}: {v}" for k, v in list(kept_fp32.items())[:6]))
        if sys.platform != "darwin":
            notes.append(
                "Numbers in the verification come from the package's decompressed MIL program run in torch (fp32 "
                "arithmetic, fp16 storage rounding): they measure the conversion and the weight compression read back "
                "from the package, not Core ML's own fp16 arithmetic. Unverified on Linux: Core ML predict, "
                "compilation, Neural Engine placement and latency -- run `python3 run.py` on a Mac or the XCTest on "
                "a device (see README.md)."
            )
        return Artifact(
            format="mlpackage",
            precision=job.precision,
            primary=PRIMARY,
            files=files,
            runtime=_host_runtime_name(ct),
            meta={
                "minimum_deployment_target": f"iOS{ios}",
                "compute_precision": "fp32" if job.precision == "fp32" else "fp16",
                "source_route": source_route,
                "compression": {"method": comp.method, "describe": comp.describe, "weight_threshold": threshold,
                                "storage_bits": comp.bits},
                "conversion_s": round(t_convert, 3),
                "compression_s": round(t_compress, 3),
                "linux_checks": checks,
                "fp32_ops": kept_fp32,  # fp16 programs: ops kept fp32, each with the measurement that chose it
                **({"quantization": {
                    "tool": "PT2E (torchao prepare_pt2e / convert_pt2e), then coremltools: iOS 17 quantize / "
                            "dequantize ops and int8 weight constants",
                    "placement": "inputs and weights of conv / linear / matmul (every other op fp16)",
                    "layers_quantized": w8a8_torch["layers"], "nodes_kept_float": w8a8_torch["kept"],
                    "weights": "int8 symmetric per-channel", "activations": "int8 per-tensor affine",
                    "calibration_method": w8a8_torch["observer"],
                    "calibration_chosen": "by measurement (output SNR dB against float)"
                    if w8a8_torch["measured_snr_db"] else "by --option",
                    "calibration_measured_snr_db": w8a8_torch["measured_snr_db"] or None,
                    "calibration_batches": w8a8_torch["batches"], "calibration_source": job.calib.source}}
                   if w8a8_torch is not None else {}),
                "io_names": {k: v for k, v in coreml_names(
                    [s.name for s in job.model.inputs + job.model.outputs]).items() if k != v},
            },
            notes=notes,
        )

    # ---------------------------------------------------------------- conversion

    def _pt2e_w8a8(self, job: ConvertJob) -> dict[str, Any]:
        """W8A8 without Core ML predict: the torch program quantized with the PT2E flow (``_w8a8_quantizer``:
        int8 inputs and per-channel int8 weights of conv / linear / matmul, per-tensor activations calibrated on
        --calib, the observer chosen by measuring each fake-quant program against float), converted by
        coremltools into iOS 17 ``quantize`` / ``dequantize`` ops before those layers and int8 weight constants:
        the int8-int8 compute the Neural Engine runs; every other op stays fp16, as Core ML runs it."""
        torch = require("torch")
        from edgekit.converters.tflite import CONVERTER as TFLITE

        m = job.model
        if not m.is_torch or m.kind == "torchscript":
            raise HostCannotError(
                f"{m.source}: precision int8 (W8A8) on Linux quantizes a torch.export program (PT2E); this model "
                "is TorchScript: run this conversion on a Mac (Core ML predict), or choose int8-weight")
        assert job.calib is not None  # the pipeline refuses int8 without --calib
        sample = tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in m.example_feeds().values())
        module = TFLITE._exported(job, TFLITE._module(job), sample)
        _comparisons_as_coreml_reads_them(module)
        # the PT2E steps are android's (observer chosen by measuring, calibration), with Core ML's quantizer
        keep = tuple(job.options.get("keep_float_nodes") or ())

        def quantizer_for(observer: str) -> Any:
            return _w8a8_quantizer(observer, keep)

        chosen, measured = TFLITE._observer(job, module, sample, keep, quantizer_for)
        with job.substep("calibration"):
            converted, q, n_batches = TFLITE._calibrated(job, module, sample, False, chosen, keep,
                                                         quantizer_for=quantizer_for, fold=True)
        layers = q.layers
        if not layers and not keep:  # every layer kept by mixed precision: built, and judged as not INT8
            raise UnsupportedOpError(f"{m.source}: precision int8 (W8A8) quantizes conv / linear / matmul inputs and "
                                     "weights, and this model has none: choose fp16")
        job.log(f"W8A8 (PT2E in torch): {layers} conv/linear/matmul layer(s) int8, observer {chosen}, "
                f"{n_batches} batches")
        return {"module": converted, "sample": sample, "observer": chosen, "measured_snr_db": measured,
                "batches": n_batches, "layers": layers, "kept": list(keep)}

    # ---------------------------------------------------------------- mixed precision (edgekit.mixed)

    @staticmethod
    def mixed_unavailable(job: ConvertJob) -> str | None:
        if sys.platform == "darwin":
            return ("on macOS W8A8 is calibrated by Core ML (linear_quantize_activations), which keeps no chosen "
                    "layer in fp16; pass --tolerance to accept this agreement")
        return None

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        """The conv / linear / matmul layers a W8A8 build may leave in fp16 (no quantize / dequantize on their
        input, fp16 weights), ranked by the SQNR of their int8 input; the search runs PT2E's fake-quant program
        in torch (fp32 elsewhere: the real re-verification runs the converted package)."""
        torch = require("torch")
        from edgekit.converters.tflite import CONVERTER as TFLITE
        from edgekit.converters.tflite import SEARCH_CALIB, _torch_run, observer_outputs

        m = job.model
        sample = tuple(torch.from_numpy(np.ascontiguousarray(v)) for v in m.example_feeds().values())
        module = TFLITE._exported(job, TFLITE._module(job), sample)
        _comparisons_as_coreml_reads_them(module)
        method = artifact.meta["quantization"]["calibration_method"]
        base = tuple(job.options.get("keep_float_nodes") or ())
        search = search_feeds(job)

        calibrated: dict[str, Any] = {}

        def fake_quant(keep: tuple[str, ...], observer: str = method):
            # calibrated once per observer: a W8A8 layer kept fp16 only loses the quantize / dequantize on its own
            # inputs and weight, and the observers saw float values either way, so the other layers' ranges are
            # the same as a calibration with it left unannotated (ppocr-rec's search: no calibration per build)
            if observer not in calibrated:
                calibrated[observer] = TFLITE._calibrated(job, module, sample, False, observer, base, SEARCH_CALIB,
                                                          lambda obs: _w8a8_quantizer(obs, base))[0]
            return _inputs_float(calibrated[observer], keep)

        layers = _w8a8_layers(fake_quant(()), search[:8], m)
        ref = _torch_run(module, search, m)
        outputs, calibration_for = observer_outputs(lambda kept, obs: fake_quant(tuple(kept), obs), job,
                                                    method, ref, search)
        return Search(layers, outputs, ref, "fp16 (no int8 quantize / dequantize on its input; fp16 weights)",
                      calibration_for)

    keep_layers = keep_layers  # the W8A8 build again with the kept fx nodes fp16 (edgekit.mixed)

    def _convert_torch(self, job: ConvertJob, ct, ios: int, force_fp32: bool = False,
                       quantized: dict[str, Any] | None = None, precision: Any = None):
        torch = require("torch")
        m = job.model
        if not m.is_torch:
            raise ConversionError(
                f"{m.source}: Core ML converts torch models (coremltools dropped its ONNX frontend); "
                "give the .pt2 / TorchScript / pkg.module:factory the ONNX came from"
            )
        names = coreml_names([s.name for s in m.inputs + m.outputs])
        inputs = [ct.TensorType(name=names[s.name], shape=s.shape, dtype=np.dtype(coreml_dtype(s.dtype)).type)
                  for s in m.inputs]
        outputs = [ct.TensorType(name=names[s.name], dtype=np.float32) for s in m.outputs]
        target = getattr(ct.target, f"iOS{ios}")
        if precision is None:
            precision = ct.precision.FLOAT32 if job.precision == "fp32" or force_fp32 else ct.precision.FLOAT16
        route = "torch.export"
        ep = None
        if quantized is not None:  # the PT2E-quantized module (W8A8 on Linux): its own export, no fallback
            try:
                source = torch.export.export(quantized["module"], quantized["sample"]).run_decompositions({})
            except Exception as exc:  # noqa: BLE001 - torch.export raises many types
                raise ConversionError(f"{m.source}: the W8A8 (PT2E) program does not export again for Core ML "
                                      f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
            try:
                return ct.convert(source, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                                  minimum_deployment_target=target, compute_precision=precision), \
                    "torch.export + PT2E W8A8"
            except Exception as exc:  # coremltools raises NotImplementedError/ValueError/RuntimeError/AssertionError
                first = _conversion_error(exc, source, m.source)
            if isinstance(first, UnsupportedOpError):
                # the float route falls back to TorchScript (aten.lstm); its frontend cannot read PT2E's int8
                # weights ("could not find quantization parameters"), so this route has no such fallback
                head = str(first).split(";")[0]
                head += ")" * max(0, head.count("(") - head.count(")"))
                raise UnsupportedOpError(
                    f"{head}; W8A8 off macOS goes through coremltools' torch.export frontend, "
                    "which lacks it (its TorchScript frontend has it but cannot read PT2E's int8 weights): a "
                    "limitation of edgekit's W8A8 route, not of Core ML; run this conversion on a Mac, or choose "
                    "int8-weight or fp16") from None
            raise first from None
        if m.kind == "torchscript":
            source, route = m.torch_module, "TorchScript"
        else:
            ep = m.exported
            if ep is None:
                example = tuple(torch.from_numpy(a) for a in m.example_feeds().values())
                try:
                    ep = torch.export.export(m.torch_module, example)
                except Exception as exc:  # torch.export refuses some Python constructs: fall back
                    job.warn(f"torch.export failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
                             "falling back to torch.jit.trace")
                    ep = None
            if ep is not None:
                source = ep.run_decompositions({})
            else:
                with torch.no_grad():
                    source = torch.jit.trace(m.torch_module, example)
                route = "torch.jit.trace (fallback)"
        def run(src):
            return ct.convert(src, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                              minimum_deployment_target=target, compute_precision=precision)

        try:
            mlmodel = run(source)
        except Exception as exc:  # coremltools raises NotImplementedError/ValueError/RuntimeError/AssertionError
            first = _conversion_error(exc, source if ep is not None else None, m.source)
            if ep is None:
                raise first from None
            # coremltools' torch.export frontend lacks ops its TorchScript frontend has (aten.lstm): try that
            example = tuple(torch.from_numpy(a) for a in m.example_feeds().values())
            try:
                with torch.no_grad():
                    traced = torch.jit.trace(m.torch_module, example, check_trace=False)
                mlmodel = run(traced)
            except Exception:  # noqa: BLE001 - the torch.export route's error is the one to report
                raise first from None
            route = "torch.jit.trace (coremltools' torch.export frontend: " + str(first).split(";")[0][-120:] + ")"
            job.log(f"Core ML: {route}")
        return mlmodel, route

    def _compress(self, job: ConvertJob, mlmodel, comp: Compression, threshold: int):
        if comp.method is None:
            return mlmodel
        cto = require("coremltools.optimize.coreml", EXTRA)
        if comp.method == "linear":
            op = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                             weight_threshold=threshold)
            return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
        if comp.method == "palettize":
            require("sklearn", EXTRA)  # k-means clustering
            nbits = int(comp.bits)
            op = cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_tensor",
                                        weight_threshold=threshold)
            return cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
        if comp.method == "prune":
            op = cto.OpMagnitudePrunerConfig(target_sparsity=0.5, weight_threshold=threshold)
            return cto.prune_weights(mlmodel, cto.OptimizationConfig(global_config=op))
        if comp.method == "w8a8":  # macOS only (checked before converting)
            assert job.calib is not None  # the pipeline refuses int8 without --calib
            samples = [{k: v.astype(np.float32) for k, v in f.items()} for f in job.calib.batches(job.model)]
            act = cto.OpLinearQuantizerConfig(mode="linear_symmetric", weight_threshold=threshold)
            mlmodel = cto.linear_quantize_activations(mlmodel, cto.OptimizationConfig(global_config=act), samples)
            w = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                            weight_threshold=threshold)
            return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=w))
        raise AssertionError(comp.method)

    # ---------------------------------------------------------------- verification

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        pkg = job.out_dir / artifact.primary
        rn = coreml_names([s.name for s in job.model.inputs + job.model.outputs])
        if _can_predict():
            ct = _ct()
            model = ct.models.MLModel(str(pkg))
            names = [rn[s.name] for s in job.model.outputs]

            def predict(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                out = model.predict({rn[k]: v.astype(np.float32) for k, v in feeds.items()})
                return [np.asarray(out[n], dtype=np.float32) for n in names]

            return predict
        from edgekit.converters.coreml_mil import MILInterpreter, load_program

        interp = MILInterpreter(load_program(pkg, decompress=True))
        batch = job.model.inputs[0].shape[0]

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            n = next(iter(feeds.values())).shape[0]
            parts = [interp({rn[k]: v[i:i + batch] for k, v in feeds.items()}) for i in range(0, n, batch)]
            return [np.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]

        return run

    @staticmethod
    def versions() -> dict[str, str]:
        return toolchain_versions("torch", "coremltools", "scikit-learn")


# ------------------------------------------------------------------ helpers


def coreml_dtype(dtype: str) -> str:
    """Core ML I/O type for a source tensor type: float32 stays (set explicitly, fp16 compute would make it
    fp16), integer inputs become int32 (Core ML has no int64 tensors)."""
    if dtype.startswith(("int", "uint", "bool")):
        return "int32"
    return "float32"


def _can_predict() -> bool:
    if sys.platform != "darwin":
        return False
    try:
        import coremltools.libcoremlpython  # noqa: F401
    except ImportError:
        return False
    return True


def _host_runtime_name(ct) -> str:
    if _can_predict():
        return f"Core ML predict (coremltools {ct.__version__}, macOS)"
    return (f"coremltools {ct.__version__} MIL program read back from the package, run in torch "
            f"{require('torch').__version__} (fp32 arithmetic, fp16 storage): measures weight compression, "
            "not Core ML's fp16 arithmetic")


def _describe(mlmodel, job: ConvertJob) -> None:
    mlmodel.short_description = f"edgekit {job.model.source} for {job.board.id} ({job.precision})"
    mlmodel.user_defined_metadata["edgekit.precision"] = job.precision
    mlmodel.user_defined_metadata["edgekit.board"] = job.board.id


_UNSUPPORTED = [
    re.compile(r"Unsupported fx node (?P<node>\S+), kind (?P<op>\S+)"),
    re.compile(r"PyTorch convert function for op '(?P<op>[^']+)' not implemented"),
]


def _conversion_error(exc: Exception, ep: Any, source: str) -> Exception:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for pat in _UNSUPPORTED:
        hit = pat.search(str(exc))
        if not hit:
            continue
        op = hit.group("op").rstrip(",")
        node_name = hit.groupdict().get("node")
        node = _find_node(ep, node_name, op)
        where = ""
        target = op
        if node is not None:
            node_name = node.name
            target = str(node.target)
            where = _source_location(node)
        return UnsupportedOpError(
            f"{source}: Core ML (coremltools) cannot convert op {target}"
            + (f" at node {node_name!r}" if node_name else "")
            + (f", from {where}" if where else "")
            + "; replace it with supported ops in the model, or register a coremltools composite op "
            "(coremltools.converters.mil.frontend.torch.register_torch_op)"
        )
    return ConversionError(f"{source}: coremltools failed: {type(exc).__name__}: {msg[:300]}")


def _find_node(ep: Any, node_name: str | None, op: str) -> Any:
    if ep is None:
        return None
    nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    for n in nodes:
        if node_name and n.name == node_name:
            return n
    for n in nodes:
        if str(n.target).split(".")[1:2] == [op] or getattr(n.target, "__name__", "").split(".")[0] == op:
            return n
    return None


def _source_location(node: Any) -> str:
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if not frames:
        return ""
    path, line, fn, code = frames[-1]
    return f"{path}:{line} in {fn} ({code.strip()[:80]})"


# fp16's largest finite value is 65504; an op whose values reach a quarter of it on the calibration samples stays
# fp32: a power (|STFT|^2) of an input twice as loud as the loudest calibration sample is 4x larger (silero-vad's
# power spectrum reaches 2e4 on calibration speech and overflows on louder held-out windows)
FP16_LIMIT = 65504.0 / 4


FP16_MARGIN = 0.5  # the host's fp16 simulation (storage rounding) may use half the fp16 tolerance: Core ML's own
# fp16 arithmetic (accumulation, ANE) adds error the host cannot measure
MAX_FP32_OPS = 64  # more than this many ops in fp32 is not an fp16 program any more: left to verification


CHECK_SAMPLES = 16  # calibration samples the fp16 checks run on, at least (an LSTM's state drifts on some inputs only)
CHECK_SAMPLES_MAX = 64  # ... and at most, for a small program (silero-vad's state drifts on windows 16 do not hold)
CHECK_WORK = 1e7  # values one check pass may compute (samples x the program's activation values per sample)
SCREEN_FACTOR = 4  # the fp16 checks screen this many times their samples (one pass each) and keep the worst: fp16's
# error is not spread evenly (a near-tie in a softmax moves most), and 16 evenly spread samples missed ppocr-cls's


def check_samples(fn) -> int:
    """How many calibration samples the fp16 checks run on: as many as CHECK_WORK activation values allow, from
    CHECK_SAMPLES to CHECK_SAMPLES_MAX (from the program's static shapes: the same count on every machine)."""
    work = 0
    for op in fn.operations:
        if op.op_type == "const":
            continue
        for v in op.outputs:
            shape = getattr(v, "shape", None) or ()
            if all(isinstance(d, (int, np.integer)) for d in shape):
                work += int(np.prod(shape)) if shape else 1
    return int(min(CHECK_SAMPLES_MAX, max(CHECK_SAMPLES, CHECK_WORK // max(1, work))))


def _feeds(job: ConvertJob, samples: int) -> list[dict[str, np.ndarray]]:
    """Calibration batches holding up to ``samples`` samples (else one batch of standard-normal inputs), keyed by Core ML names."""
    rn = coreml_names([s.name for s in job.model.inputs + job.model.outputs])
    if job.calib is not None:  # spread over the whole file (windows of one recording run from quiet to loud)
        bs = _batch(job)
        n = len(job.calib)
        idx = np.unique(np.linspace(0, n - 1, min(n, max(bs, samples - samples % bs))).astype(int))
        feeds = list(job.calib.subset(idx).batches(job.model))
    else:
        rng = np.random.default_rng(0)
        feeds = [{s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in job.model.inputs}]
    return [{rn[k]: v for k, v in f.items()} for f in feeds]


def _batch(job: ConvertJob) -> int:
    return max(1, job.model.inputs[0].shape[0] if job.model.inputs[0].shape else 1)


def _judge(job: ConvertJob, ref: list[list[np.ndarray]], got: list[list[np.ndarray]], w8a8: bool = False
           ) -> dict[int, str]:
    """Failures of the fp16 outputs ``got`` against ``ref`` (per feed, per output), {output index: reason}, judged
    as verification judges them (each output's kind) with the fp16 tolerance times FP16_MARGIN (min SNR 6 dB
    higher). ``w8a8``: a W8A8 program against itself computed in fp32, with the int8 tolerance times FP16_MARGIN:
    fp16 rounding before an int8 quantize moves some values by a whole int8 step, which the fp16 tolerance would
    count as fp16's error (silero-vad: 5% of its output range wherever the fp32 ops were put)."""
    from edgekit.verify import output_checks

    smoke = output_checks()
    tol = (None if w8a8 else job.target.tolerances.get("fp16")) or job.target.tolerances[job.precision]
    tight = tol.model_dump()
    tight["max_rel_error"] *= FP16_MARGIN
    if tight.get("min_snr_db") is not None:
        tight["min_snr_db"] += 6
    kinds = job.output_kinds
    failures = {}
    bs = _batch(job)
    refs, axes = smoke.merge_batches(ref, bs)
    gots = smoke.merge_batches(got, bs, axes)[0]
    for i, spec in enumerate(job.model.outputs):
        r, g = refs[i], gots[i]
        kind = kinds.get(spec.name) or smoke.infer_kind(r, len(job.model.outputs))
        bad = smoke.check_output(spec.name, kind, r, g, tight, "fp16 (host simulation)")["failures"]
        if bad:
            failures[i] = bad[0]
    return failures


def fp16_fits(job: ConvertJob, mlmodel, w8a8: bool = False) -> bool:
    """Whether an fp16 program is fine as it is, on CHECK_SAMPLES calibration samples: no value beyond fp16's range
    (FP16_LIMIT) and outputs within FP16_MARGIN of the fp16 tolerance of the float model, or (``w8a8``) of the
    same program run without fp16 rounding, by ``_judge``'s W8A8 rule (its int8 error is judged elsewhere). A
    program the host interpreter cannot run is taken as it is (verification says so)."""
    from edgekit.converters.coreml_mil import MILInterpreter

    prog = getattr(mlmodel, "_mil_program", None)
    if prog is None:
        return True
    try:
        interp = MILInterpreter(_dense_program(mlmodel) if w8a8 else prog)
    except Exception:  # noqa: BLE001 - an op the host interpreter lacks: nothing to measure here
        return True
    feeds = _feeds(job, SCREEN_FACTOR * check_samples(interp.fn))
    peaks: dict[str, float] = {}
    unrounded = [[o.numpy() for o in interp._run(f, True, peaks, None)] for f in feeds]
    if any(v > FP16_LIMIT for v in peaks.values()):
        return False
    # judged against the float model, as verification judges the package: the fp16 program run without rounding
    # still has fp16 weights and its input casts, whose error alone moved ddddocr-det's boxes by half the tolerance
    ref = (None if w8a8 else _float_reference(job, feeds)) or unrounded
    return not _judge(job, ref, [interp(f) for f in feeds], w8a8=w8a8)


def _worst_first(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> list[int]:
    """Feed indices ordered by how far ``got`` strays from ``ref`` (the largest error of any output, relative to
    that output's range over all feeds), worst first."""
    n_out = len(ref[0])
    span = [max(float(np.ptp(np.concatenate([np.ravel(r[i]) for r in ref]))), 1e-12) for i in range(n_out)]
    score = [max(float(np.max(np.abs(np.asarray(g[i], np.float64) - r[i]), initial=0.0)) / span[i]
                 for i in range(n_out)) for r, g in zip(ref, got, strict=True)]
    return sorted(range(len(ref)), key=lambda k: -score[k])


def _dense_program(mlmodel) -> Any:
    """The MIL program with its compressed (int8) weights expanded, as the host interpreter runs it."""
    from coremltools.optimize.coreml import decompress_weights

    return decompress_weights(mlmodel)._mil_program


def _beyond_fp16(peaks: dict[str, float]) -> dict[str, str]:
    """The ops whose peak passes FP16_LIMIT, largest first, each with the reason it stays fp32."""
    return {k: f"values reach {v:.3g}" + (", beyond fp16's 65504" if v > 65504 else ", within 4x of fp16's 65504")
            for k, v in sorted(peaks.items(), key=lambda kv: -kv[1]) if v > FP16_LIMIT}


def _float_reference(job: ConvertJob, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]] | None:
    """The float model's outputs on feeds keyed by Core ML names (None where the reference cannot run them)."""
    back = {v: k for k, v in coreml_names([s.name for s in job.model.inputs + job.model.outputs]).items()}
    try:
        run = job.model.reference()
        return [[np.asarray(o, dtype=np.float32) for o in run({back[k]: v for k, v in f.items()})] for f in feeds]
    except Exception:  # noqa: BLE001 - the unrounded program is the reference then
        return None


def _in_vars(op) -> list:
    """The variables an op reads (list-valued inputs, such as concat's, flattened)."""
    return [var for v in op.inputs.values() for var in (v if isinstance(v, (list, tuple)) else [v])]


def _levels(start: list, step) -> dict[str, int]:
    """Breadth-first distance in ops from ``start`` (0), following ``step(op)`` (consts are not counted)."""
    dist: dict[str, int] = {}
    frontier, d = start, 0
    while frontier:
        nxt = []
        for op in frontier:
            if op.name in dist or op.op_type == "const":
                continue
            dist[op.name] = d
            nxt += step(op)
        frontier, d = nxt, d + 1
    return dist


def _distances(fn, outputs: list[str]) -> dict[str, int]:
    """Each op's distance in ops from the named outputs of a MIL function (0: the op that makes one)."""
    producer = {v.name: op for op in fn.operations for v in op.outputs}
    return _levels([producer[n] for n in outputs if n in producer],
                   lambda op: [producer[var.name] for var in _in_vars(op) if getattr(var, "name", None) in producer])


def _distances_from_inputs(fn, inputs: list[str]) -> dict[str, int]:
    """Each op's distance in ops from the inputs of a MIL function (0: an op that reads an input)."""
    readers: dict[str, list] = {}
    for op in fn.operations:
        for var in _in_vars(op):
            if getattr(var, "name", None) is not None:
                readers.setdefault(var.name, []).append(op)
    return _levels([op for n in inputs for op in readers.get(n, [])],
                   lambda op: [r for out in op.outputs for r in readers.get(out.name, [])])


def fp16_keep(job: ConvertJob, m32, w8a8: bool = False) -> dict[str, str]:
    """The ops of an fp32 program to keep fp32 in its fp16 version, each with the reason, measured on CHECK_SAMPLES
    calibration batches (edgekit's MIL interpreter on the fp32 program): the ones, of SCREEN_FACTOR times as many,
    whose outputs move most with every op in fp16 (the search's half: the worst of them):

    1. ops whose values in or out reach a quarter of fp16's range (FP16_LIMIT): kept, all of them;
    2. then, where the simulated fp16 program (those ops fp32, every other op's inputs, weights and outputs
       rounded to fp16) fails the fp16 tolerance times FP16_MARGIN on some outputs: the ops nearest those
       outputs (a softmax over a large vocabulary and the logits before it, the log of a spectrogram, an LSTM's
       state), the fewest levels that pass (doubling, then bisection; at most MAX_FP32_OPS ops), then each of
       them tried back in fp16 (farthest first) and left there where the outputs stay within tolerance.
       None pass: only (1); verification reports the error.

    ``w8a8``: ``m32`` is a W8A8 program (int8 weights expanded for the interpreter), judged against itself in fp32
    with the int8 tolerance (``_judge``)."""
    from edgekit.converters.coreml_mil import MILInterpreter

    t0 = time.perf_counter()
    interp = MILInterpreter(_dense_program(m32) if w8a8 else m32._mil_program)
    n = check_samples(interp.fn)
    feeds = _feeds(job, SCREEN_FACTOR * n)
    peaks: dict[str, float] = {}
    ref = [[o.numpy() for o in interp._run(f, True, peaks, None)] for f in feeds]
    keep = _beyond_fp16(peaks)
    float_ops = {op.name for op in interp.fn.operations if op.op_type != "const"}
    passes = [len(feeds)]
    if len(feeds) > n:  # screened: every op fp16 once on each feed, and the search measures the worst ones
        half = float_ops - set(keep)
        passes[0] += len(feeds)
        order = _worst_first(ref, [interp(f, half=half) for f in feeds])[:max(1, n // _batch(job))]
        feeds, ref = [feeds[k] for k in order], [ref[k] for k in order]

    def fails(names, n: int = len(feeds) // 2) -> dict[int, str]:  # the search runs on half the samples
        passes[0] += len(feeds[:n])
        half = float_ops - set(keep) - set(names)
        return _judge(job, ref[:n], [interp(f, half=half) for f in feeds[:n]], w8a8=w8a8)

    first = fails((), len(feeds))
    if not first:
        return keep

    def search(dist: dict[str, int]) -> list[str] | None:
        """The fewest distance levels (from the outputs, or from the inputs) whose ops kept fp32 pass."""
        levels = sorted(set(dist.values()))

        def within(d):
            return [k for k, v in sorted(dist.items(), key=lambda kv: kv[1]) if v <= d and k not in keep]

        lo, hi, d = -1, None, 0
        while hi is None and lo < levels[-1] and len(within(lo + 1)) <= MAX_FP32_OPS:
            d = min(d, levels[-1])
            if len(within(d)) > MAX_FP32_OPS or fails(within(d)):
                lo, d = d, 2 * d + 1
            else:
                hi = d
        if hi is None:
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(within(mid)):
                lo = mid
            else:
                hi = mid
        chosen = within(hi)
        for name in sorted(chosen, key=lambda k: -dist[k])[:-1] if len(chosen) <= 12 else []:
            rest = [k for k in chosen if k != name]
            if not fails(rest):
                chosen = rest
        if fails(chosen, len(feeds)):  # confirmed on all the samples; else the search's margin was too thin
            chosen = within(hi)
        return chosen

    # the error is made near the outputs (a softmax over a large vocabulary, a log), or near the inputs (the input
    # rounded to fp16, the first layers' weights: a detector's boxes, a recogniser's probabilities)
    dist = _distances(interp.fn, [interp.output_names[i] for i in first])
    side = "an output"
    chosen = search(dist)
    if chosen is None:
        dist, side = _distances_from_inputs(interp.fn, interp.input_names), "an input"
        chosen = search(dist)
    if chosen is None:
        job.warn(f"fp16: keeping the {MAX_FP32_OPS} ops nearest the outputs, or the inputs, in fp32 does not bring "
                 f"the simulated fp16 program within tolerance ({next(iter(first.values()))}); only ops beyond "
                 "fp16's range are kept fp32")
        return keep
    kinds = {op.name: op.op_type for op in interp.fn.operations}
    for name in chosen:
        keep[name] = f"{kinds[name]} {dist[name]} op(s) from {side}: fp16 there moves the outputs too far"
    job.log(f"fp16 everywhere (host simulation): {next(iter(first.values()))}; {len(chosen)} op(s) kept fp32 bring "
            f"it within tolerance ({passes[0]} interpreter passes, {time.perf_counter() - t0:.1f} s)")
    return keep


_MIL_RESERVED = {"any", "bool", "program", "func", "tensor", "list", "dict", "tuple", "true", "false", "string",
                 "bf16", "fp16", "fp32", "fp64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "state"}


def _comparisons_as_coreml_reads_them(gm: Any) -> int:
    """aten.greater_equal / greater / less_equal / less (what onnx2torch writes for ONNX comparisons) as their
    aliases ge / gt / le / lt, which coremltools' torch.export frontend converts (it has no converter under the
    long names; the float route reaches them through TorchScript, which the W8A8 route cannot take)."""
    torch = require("torch")
    a = torch.ops.aten
    alias = {a.greater_equal.Tensor: a.ge.Tensor, a.greater_equal.Scalar: a.ge.Scalar,
             a.greater.Tensor: a.gt.Tensor, a.greater.Scalar: a.gt.Scalar,
             a.less_equal.Tensor: a.le.Tensor, a.less_equal.Scalar: a.le.Scalar,
             a.less.Tensor: a.lt.Tensor, a.less.Scalar: a.lt.Scalar}
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in alias:
            node.target = alias[node.target]
            n += 1
    if n:
        gm.recompile()
    return n


def _inputs_float(program: Any, kept: tuple[str, ...]) -> Any:
    """A copy of the W8A8 fake-quant ``program`` where the nodes named in ``kept`` read their inputs and weight
    in float: each ``dequantize(quantize(x))`` argument of theirs replaced by ``x`` (another reader of ``x`` keeps
    its own rounding). The same program as a calibration with those nodes left unannotated."""
    import copy

    torch = require("torch")
    if not kept:
        return program
    gm = copy.deepcopy(program)
    names = set(kept)

    def source(a):
        if isinstance(a, torch.fx.Node) and "dequantize" in str(a.target) and a.args:
            q = a.args[0]
            if isinstance(q, torch.fx.Node) and "quantize" in str(q.target) and q.args:
                return q.args[0]
        return a

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.name in names:
            n.args = tuple(source(a) for a in n.args)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def _w8a8_quantizer(observer: str, keep: tuple[str, ...] = ()) -> Any:
    """A PT2E quantizer for Core ML W8A8: the inputs of conv / linear / matmul int8 per tensor (observer
    ``histogram`` or ``minmax``) and their weights int8 symmetric per channel; no other op is annotated, so it
    stays fp16 in the ML program (the Neural Engine computes elementwise ops, pools and concats in fp16; as
    TensorRT's Q/DQ placement does). The specs are litert-torch's symmetric config (the android extra). The fx
    nodes named in ``keep`` are left unannotated: fp16 (mixed precision)."""
    import dataclasses

    torch = require("torch")
    pq = require("litert_torch.quantize.pt2e_quantizer", "android")
    from torchao.quantization.pt2e import MinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, Quantizer

    from edgekit.converters.tflite import weight_scale_floor_off

    cfg = weight_scale_floor_off(pq.get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    act, weight = cfg.input_activation, cfg.weight
    if observer == "minmax":
        act = dataclasses.replace(act, observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12))
    a = torch.ops.aten
    # conv_transpose stays fp16: its per-channel int8 weights came out wrong through coremltools (PP-OCRv4's
    # detector lost its whole map: IoU 0.00)
    weighted = {a.conv1d.default, a.conv2d.default, a.linear.default}
    batched = {a.matmul.default, a.bmm.default}

    class CoreMLW8A8Quantizer(Quantizer):
        layers = 0

        def annotate(self, model):
            for n in model.graph.nodes:
                if n.op != "call_function" or n.target not in weighted | batched or n.name in keep:
                    continue
                ins = [x for x in n.args[:2] if isinstance(x, torch.fx.Node)]
                if len(ins) < 2:
                    continue
                in_map = {ins[0]: act, ins[1]: weight if n.target in weighted else act}
                n.meta["quantization_annotation"] = QuantizationAnnotation(input_qspec_map=in_map, _annotated=True)
                self.layers += 1
            return model

        def validate(self, model):
            return None

    return CoreMLW8A8Quantizer()


def _w8a8_layers(converted: Any, feeds: list[dict[str, np.ndarray]], m: Any) -> list[Layer]:
    """Each conv / linear / matmul of a W8A8 fake-quant program with the SQNR of its int8 input (the tensor
    before and after its quantize / dequantize, on the same runs) or, where lower, of its int8 weights at its
    output: the cheap ranking of the mixed search."""
    torch = require("torch")
    from edgekit.converters.tflite import _weight_noise

    seen: dict[str, list[tuple]] = {}
    weights: dict[str, list[float]] = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.op == "call_function" and "quantize_per_tensor" in str(n.target) and "dequantize" not in str(
                    n.target) and isinstance(n.args[0], torch.fx.Node):
                x, scale, zp, lo, hi = (self.env[n.args[0]], *[self.env[a] if isinstance(a, torch.fx.Node) else a
                                                                 for a in n.args[1:5]])
                deq = (torch.clamp(torch.round(x / scale) + zp, lo, hi) - zp) * scale
                seen.setdefault(n.args[0].name, []).append((x.detach().numpy(), deq.detach().numpy()))
            _weight_noise(self, n, out, weights)
            return out

    with torch.no_grad():
        for f in feeds:
            Rec(converted).run(*[torch.from_numpy(np.ascontiguousarray(f[s.name])) for s in m.inputs])

    def producer(node: Any) -> Any:  # dequantize(quantize(x)) -> x
        while isinstance(node, torch.fx.Node) and "quantize" in str(node.target) and node.args:
            node = node.args[0]
        return node

    layers = []
    for n in converted.graph.nodes:
        if n.op != "call_function" or not any(k in str(n.target) for k in ("conv", "linear", "matmul", "bmm")):
            continue
        x = producer(n.args[0]) if n.args else None
        if not isinstance(x, torch.fx.Node) or x.name not in seen or x is n.args[0]:
            continue  # not quantized (kept, or not an annotated layer)
        a = np.concatenate([u.ravel() for u, _ in seen[x.name]]).astype(np.float64)
        d = np.concatenate([v.ravel() for _, v in seen[x.name]]).astype(np.float64)
        local = mixed_db(float(np.sum(a ** 2)), float(np.sum((a - d) ** 2)))
        if n.name in weights:  # its int8 weights at its output, where they lose more than its input does
            local = min(local, mixed_db(*weights[n.name]))
        layers.append(Layer(n.name, str(n.target).split(".")[-2] if "." in str(n.target) else str(n.target),
                            round(local, 2)))
    return layers


def coreml_names(names: list[str]) -> dict[str, str]:
    """Core ML feature names for the model's input / output names: MIL takes ``[A-Za-z_][A-Za-z0-9_]*``
    (coremltools' NameSanitizer would rename ``x.1`` or ``save_infer_model/scale_0.tmp_1`` silently; edgekit
    names them itself, the same way, and records the mapping as the manifest's ``runtime_name``)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for n in names:
        new = re.sub(r"[^A-Za-z0-9_]", "_", n)
        if re.match(r"[^A-Za-z_]", new):
            new = "_" + new
        if new in _MIL_RESERVED:
            new += "_workaround"
        base, k = new, 0
        while new in used:
            new, k = f"{base}_{k}", k + 1
        used.add(new)
        out[n] = new
    return out


W8A8_CONSUMERS = frozenset({"conv", "linear", "matmul"})  # the ops whose weights _w8a8_quantizer stores int8


def linux_checks(job: ConvertJob, pkg: Path, comp: Compression, threshold: int, mixed: bool = False,
                 consumers: frozenset[str] | None = None, kept_layers: int = 0) -> dict[str, Any]:
    """Static checks of the saved package; raises ConversionError where it does not match the request."""
    from edgekit.converters import coreml_mil as cm

    try:
        sig = cm.io_signature(pkg)
        raw = cm.load_program(pkg, decompress=False)
        dense = cm.load_program(pkg, decompress=True)
    except Exception as exc:
        raise ConversionError(f"{pkg}: the saved package does not load back ({type(exc).__name__}: {exc})") from None
    problems = []
    rn = coreml_names([s.name for s in job.model.inputs + job.model.outputs])
    for kind, specs in (("input", job.model.inputs), ("output", job.model.outputs)):
        got = sig[f"{kind}s"]
        want = [{"name": rn[s.name], "shape": list(s.shape), "dtype": coreml_dtype(s.dtype)} for s in specs]
        if [(g["name"], g["shape"], g["dtype"]) for g in got] != [(w["name"], w["shape"], w["dtype"]) for w in want]:
            problems.append(f"{kind}s are {got}, the source model has {want}")
    weights = weight_bytes(raw, dense, pkg, comp, threshold, job.precision, mixed, consumers, kept_layers)
    problems += weights.pop("problems")
    if problems:
        raise ConversionError(f"{pkg.name} does not match the request: " + "; ".join(problems))
    return {
        "spec_loads": True,
        "spec_version": sig["spec_version"],
        "io": {"inputs": sig["inputs"], "outputs": sig["outputs"], "matches_source": True},
        "op_counts": cm.op_counts(raw),
        "ane_flags": cm.ane_flags(raw, "fp32" if job.precision == "fp32" else "fp16"),
        "weights": weights,
    }


def weight_bytes(raw, dense, pkg: Path, comp: Compression, threshold: int, precision: str,
                 mixed: bool = False, consumers: frozenset[str] | None = None, kept_layers: int = 0) -> dict[str, Any]:
    """Measured weight-file bytes against what the requested compression should take. ``kept_layers``: layers
    a mixed-precision W8A8 build leaves fp16 on purpose; up to that many eligible weights may stay uncompressed."""
    from edgekit.converters import coreml_mil as cm

    elem_bytes = 4 if precision == "fp32" else 2
    weights = cm.float_weights(dense)
    compressed = cm.compressed_weights(raw)
    eligible = [w for w in weights if int(np.prod(w[1])) >= threshold and (consumers is None or w[2] in consumers)
                ] if comp.method else []
    if kept_layers and eligible:  # the kept layers' weights are plain fp16 consts in the stored program
        plain = {w[0] for w in cm.float_weights(raw) if consumers is None or w[2] in consumers}
        if len([w for w in eligible if w[0] in plain]) <= kept_layers:
            eligible = [w for w in eligible if w[0] not in plain]
    n_all = sum(int(np.prod(s)) for _, s, _ in weights)
    n_elig = sum(int(np.prod(s)) for _, s, _ in eligible)
    # every other float const (biases, small weights, ...) is stored at the compute precision
    n_other_consts = sum(
        int(np.asarray(op.val.val).size) for op in dense.functions["main"].operations
        if op.op_type == "const" and isinstance(op.val.val, np.ndarray) and op.val.val.dtype.kind == "f"
    ) - n_elig
    expected_data = n_elig * comp.bits / 8 + n_other_consts * elem_bytes
    if mixed:  # ops kept fp32 in an fp16 program keep their consts fp32: count each const at its stored dtype
        expected_data = n_elig * comp.bits / 8 + sum(
            int(np.asarray(op.val.val).size) * np.asarray(op.val.val).dtype.itemsize
            for op in raw.functions["main"].operations
            if op.op_type == "const" and isinstance(op.val.val, np.ndarray) and op.val.val.dtype.kind == "f")
    blobs = sum(1 for op in raw.functions["main"].operations
                if op.op_type == "const" and isinstance(op.val.val, np.ndarray) and op.val.val.size >= 2)
    overhead = 64 + 128 * blobs  # file header; per blob a 64-byte header and 64-byte alignment
    if comp.method == "palettize":
        overhead += len(eligible) * (2 ** int(comp.bits)) * elem_bytes  # one LUT per tensor
    if comp.method == "linear":
        overhead += sum(int(s[0]) for _, s, _ in eligible) * 3  # per-channel scale (fp16) + zero point
    measured = cm.weight_bin_bytes(pkg)
    problems = []
    if measured > expected_data * 1.1 + overhead or measured < expected_data * 0.9:
        problems.append(
            f"weight file is {measured:,} bytes, {precision} should take about {int(expected_data):,} "
            f"(+ up to {overhead:,} bytes of headers/alignment)"
        )
    want_ops = cm.COMPRESSION_OPS.get(comp.method or "", ())
    if comp.method in cm.COMPRESSION_OPS:
        n_compressed = sum(1 for v in compressed.values() if v in want_ops)
        if n_compressed < len(eligible):
            problems.append(f"only {n_compressed} of {len(eligible)} weights >= {threshold} elements are stored "
                            f"as {'/'.join(want_ops)}")
    other_bytes = n_other_consts * elem_bytes
    return {
        "measured_bytes": measured,
        "expected_bytes": int(expected_data),
        "allowed_overhead_bytes": overhead,
        "fp32_weight_bytes": 4 * n_all,  # conv/linear weights only
        "fp32_bytes": 4 * (n_elig + n_other_consts),  # every float const: weights and biases
        "weight_tensors": len(weights),
        "compressed_tensors": len(eligible),
        "compressed_elements": n_elig,
        "compressed_ratio_vs_fp32": round((measured - other_bytes) / (4 * n_elig), 4) if n_elig else None,
        "file_ratio_vs_fp32_weights": round(measured / (4 * n_all), 4) if n_all else None,
        "storage": {k: v for k, v in sorted(Counter(compressed.values()).items())},
        "problems": problems,
    }


CONVERTER = CoreMLConverter()
