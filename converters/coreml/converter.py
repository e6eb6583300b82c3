"""The Core ML converter: a torch model as an ML program (``.mlpackage``) at the job's precision, checked on
Linux and verified on the host (Core ML predict on macOS, the host MIL interpreter elsewhere)."""

from __future__ import annotations

import sys
import time

import numpy as np

from edgekit.converters import Artifact, ConvertJob, Runner
from edgekit.converters.coreml import search
from edgekit.converters.coreml.checks import linux_checks
from edgekit.converters.coreml.compression import (
    COMPRESSIONS,
    WEIGHT_THRESHOLD,
    Compression,
    compress,
    deployment_target,
)
from edgekit.converters.coreml.fp16 import fp16_fits, fp16_keep
from edgekit.converters.coreml.mlprogram import coreml_names, convert_torch, load_coremltools
from edgekit.converters.coreml.w8a8 import W8A8_CONSUMERS, pt2e_w8a8
from edgekit.deps import require, toolchain_versions
from edgekit.errors import ConversionError
from edgekit.mixed.search import Search, keep_layers

PRIMARY = "model.mlpackage"


class CoreMLConverter:
    name = "coreml"

    def convert(self, job: ConvertJob) -> Artifact:
        ct = load_coremltools()
        if job.precision not in COMPRESSIONS:
            raise ConversionError(f"precision {job.precision!r} is not offered by Core ML; one of {list(COMPRESSIONS)}")
        comp = COMPRESSIONS[job.precision]
        ios = deployment_target(job)
        t0 = time.perf_counter()
        w8a8_torch = None  # W8A8 calibrated in torch (PT2E) where Core ML predict is missing (Linux)
        if comp.method == "w8a8" and sys.platform != "darwin":
            w8a8_torch = pt2e_w8a8(job)
        with job.substep("MIL conversion"):
            mlmodel, source_route = convert_torch(job, ct, ios, quantized=w8a8_torch)
        kept_fp32: dict[str, str] = {}
        if w8a8_torch is not None:  # weights already int8 (constexpr_affine_dequantize): nothing left to compress
            comp = Compression("linear", 8, ios, "W8A8: int8 per-channel weights and int8 per-tensor activations, "
                                                 f"calibrated in torch (PT2E, {w8a8_torch['observer']} observer) "
                                                 "on --calib")
            given = job.options.get("fp32_ops")  # a mixed-precision rebuild: the first build's, as measured there
            if given is not None:
                kept_fp32 = dict(given)
            elif not fp16_fits(job, mlmodel, w8a8=True):
                # a power spectrum beyond fp16, an LSTM state that fp16 storage moves: the same measured choice as
                # an fp16 build, against the W8A8 program computed in fp32 (its int8 error is the search's and
                # verification's to judge)
                m32, source_route = convert_torch(job, ct, ios, force_fp32=True, quantized=w8a8_torch)
                kept_fp32 = fp16_keep(job, m32, w8a8=True)
            if kept_fp32:
                keep = frozenset(kept_fp32)
                job.log(f"W8A8: {len(kept_fp32)} op(s) kept fp32 (fp16 moves the outputs too far, or their values "
                        "pass its range): " + "; ".join(f"{k}: {v}" for k, v in list(kept_fp32.items())[:4]))
                # converted again from the torch program (a converted program's int8 weights do not survive a
                # second conversion); the fp16 pass meets the same op names as the fp32 conversion measured
                mlmodel, source_route = convert_torch(
                    job, ct, ios, quantized=w8a8_torch,
                    precision=ct.transform.FP16ComputePrecision(op_selector=lambda op: op.name not in keep))
        elif job.precision != "fp32" and not fp16_fits(job, mlmodel):
            # some values exceed fp16's range, or fp16 storage moves the outputs too far: convert at fp32 (stable op
            # names), choose by measurement the fewest ops to leave in fp32, and run coremltools' fp16 pass on that
            # program with those ops left in fp32
            m32, source_route = convert_torch(job, ct, ios, force_fp32=True)
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
            mlmodel = compress(job, mlmodel, comp, threshold)
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

    # ---------------------------------------------------------------- mixed precision (edgekit.mixed.search)

    @staticmethod
    def mixed_unavailable(job: ConvertJob) -> str | None:
        return search.mixed_unavailable(job)

    def mixed_search(self, job: ConvertJob, artifact: Artifact) -> Search:
        """The conv / linear / matmul layers a W8A8 build may leave in fp16 (:func:`search.mixed_search`)."""
        return search.mixed_search(job, artifact)

    keep_layers = keep_layers  # the W8A8 build again with the kept fx nodes fp16 (edgekit.mixed.search)

    # ---------------------------------------------------------------- verification

    def host_runner(self, job: ConvertJob, artifact: Artifact) -> Runner:
        pkg = job.out_dir / artifact.primary
        rn = coreml_names([s.name for s in job.model.inputs + job.model.outputs])
        if _can_predict():
            ct = load_coremltools()
            model = ct.models.MLModel(str(pkg))
            names = [rn[s.name] for s in job.model.outputs]

            def predict(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
                out = model.predict({rn[k]: v.astype(np.float32) for k, v in feeds.items()})
                return [np.asarray(out[n], dtype=np.float32) for n in names]

            return predict
        from edgekit.converters.coreml.interpreter import MILInterpreter
        from edgekit.converters.coreml.mil import load_program

        interp = MILInterpreter(load_program(pkg, decompress=True))
        batch, specs = job.model.batch, {s.name: s for s in job.model.inputs}

        def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            if all(tuple(v.shape) == tuple(specs[k].shape) for k, v in feeds.items() if k in specs):
                return interp({rn[k]: v for k, v in feeds.items()})  # one run (each input on its batch axis)
            n = next(iter(feeds.values())).shape[0]
            parts = [interp({rn[k]: v[i:i + batch] for k, v in feeds.items()}) for i in range(0, n, batch)]
            return [np.concatenate([p[j] for p in parts]) for j in range(len(parts[0]))]

        return run

    @staticmethod
    def versions() -> dict[str, str]:
        return toolchain_versions("torch", "coremltools", "scikit-learn")


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


CONVERTER = CoreMLConverter()
