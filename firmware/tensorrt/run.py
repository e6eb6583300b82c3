#!/usr/bin/env python3
"""edgekit device runner for Jetson bundles (TensorRT, or onnxruntime).

Runs on the board with only numpy and the runtime the board has. Kept to Python 3.6
syntax: JetPack 4.6 (Jetson Nano) ships Python 3.6.

    python3 run.py                      # TensorRT: load model.engine or build it from model.onnx
    python3 run.py --runtime onnxruntime
    python3 run.py --build-only         # build model.engine (same as build_engine.sh)

Steps: integrity (sha256 of every file in manifest.json) -> load -> golden outputs within
the manifest's tolerances -> latency p50/p90/p99 after warm-up -> peak memory -> power
(INA3221 rails where the board exposes them, else "not measured") -> smoke_result.json.
Exit code 0 when every check passes, 1 when one fails, 2 when the bundle is unusable.
"""

import argparse
import os
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# edgekit_smoke.py (the shared smoke-test core) sits next to this file in a bundle and in
# ../common in the source tree
for _d in (HERE, os.path.join(os.path.dirname(HERE), "common")):
    if _d not in sys.path:
        sys.path.insert(0, _d)
from edgekit_smoke import Smoke, golden_feeds, log, read_manifest  # noqa: E402


# ----------------------------------------------------------------- power


def find_power_rails():
    """INA3221 rails via hwmon (JetPack 5/6) or the iio driver (JetPack 4)."""
    rails = []
    base = "/sys/class/hwmon"
    if os.path.isdir(base):
        for hw in sorted(os.listdir(base)):
            d = os.path.join(base, hw)
            try:
                with open(os.path.join(d, "name")) as f:
                    name = f.read().strip()
            except OSError:
                continue
            if name != "ina3221":
                continue
            for ch in (1, 2, 3):
                v, c = os.path.join(d, "in%d_input" % ch), os.path.join(d, "curr%d_input" % ch)
                if os.path.exists(v) and os.path.exists(c):
                    label = "rail%d" % ch
                    lf = os.path.join(d, "in%d_label" % ch)
                    if os.path.exists(lf):
                        with open(lf) as f:
                            label = f.read().strip()
                    rails.append((label, v, c, 1e-6))  # mV * mA -> W
    iio = "/sys/bus/i2c/drivers/ina3221x"
    if not rails and os.path.isdir(iio):
        for root, _dirs, files in os.walk(iio):
            for fn in files:
                if fn.startswith("in_power") and fn.endswith("_input"):
                    rails.append((fn, os.path.join(root, fn), None, 1e-3))  # mW -> W
    return rails


def read_power_w(rails):
    total = 0.0
    # VDD_IN is the whole module's input; when present it is the number to report
    module = [r for r in rails if r[0] in ("VDD_IN", "POM_5V_IN")]
    for label, v, c, scale in module or rails:
        with open(v) as f:
            a = float(f.read().strip())
        if c is not None:
            with open(c) as f:
                a *= float(f.read().strip())
        total += a * scale
    return total


class PowerSampler(object):
    def __init__(self, rails, period_s=0.05):
        self.rails, self.period_s, self.samples = rails, period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.daemon = True

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(read_power_w(self.rails))
            except (OSError, ValueError):
                pass
            self._stop.wait(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------- runtimes


class OnnxRuntimeModel(object):
    def __init__(self, onnx_path, threads=0):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        # x86 CPUs with AVX2 but no VNNI: onnxruntime's fused int8 kernels multiply with
        # VPMADDUBSW, whose int16 sums saturate; with symmetric int8 activations the digits
        # model lost 60 points (98.4 -> 38.4 %) on an AVX2 EPYC. Precision mode avoids the
        # saturating path (TensorRT and ARM kernels accumulate in int32 and never had it).
        opts.add_session_config_entry("session.x64quantprecision", "1")
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
        self.options = ["session.x64quantprecision=1"]
        try:
            self.sess = ort.InferenceSession(onnx_path, opts, providers=providers)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own Fail/InvalidGraph types
            # onnxruntime 1.32: some Q/DQ graphs fail to load ("AddInitializedOrtValue: Attempt to replace the
            # existing tensor") only when precision mode meets ORT_ENABLE_ALL; they load with BASIC optimization
            if "AddInitializedOrtValue" not in str(exc) and "replace the existing tensor" not in str(exc):
                raise
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            self.sess = ort.InferenceSession(onnx_path, opts, providers=providers)
            self.options.append("graph_optimization_level=ORT_ENABLE_BASIC (retried: %s)" % str(exc).strip()[:80])
        self.output_names = [o.name for o in self.sess.get_outputs()]
        self.name = "onnxruntime %s (%s)" % (ort.__version__, self.sess.get_providers()[0])
        if len(self.options) > 1:  # the smoke result says which session options the board needed
            self.name += " [%s]" % "; ".join(self.options)

    def __call__(self, feeds):
        return self.sess.run(self.output_names, feeds)


def _cuda():
    """CUDA runtime calls from cuda-python (new or old layout), else pycuda."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        return "cudart", cudart
    except ImportError:
        pass
    try:
        from cuda import cudart  # older cuda-python
        return "cudart", cudart
    except ImportError:
        pass
    try:
        import pycuda.autoinit  # noqa: F401
        import pycuda.driver as cuda
        return "pycuda", cuda
    except ImportError:
        raise RuntimeError("TensorRT needs cuda-python or pycuda to move buffers: pip3 install cuda-python")


def _check(result):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError("CUDA error %s" % err)
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None


def build_engine(onnx_path, engine_path, precision, timing_cache=None, workspace_mb=1024, log=print):
    """Build and save a TensorRT engine from the ONNX (explicit Q/DQ for INT8)."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt, "NetworkDefinitionCreationFlag") and hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with open(onnx_path, "rb") as f:
        if not parser.parse(f.read()):
            errs = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise RuntimeError("TensorRT cannot parse %s: %s" % (onnx_path, "; ".join(errs)))
    config = builder.create_builder_config()
    if hasattr(config, "set_memory_pool_limit"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    if precision in ("fp16", "int8") and builder.platform_has_fast_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        if not builder.platform_has_fast_int8:
            raise RuntimeError("this GPU has no fast INT8 (e.g. Maxwell Jetson Nano): use an fp16 bundle")
        config.set_flag(trt.BuilderFlag.INT8)  # explicit Q/DQ: no calibrator needed
    cache = None
    if timing_cache:
        blob = b""
        if os.path.exists(timing_cache):
            with open(timing_cache, "rb") as f:
                blob = f.read()
        cache = config.create_timing_cache(blob)
        config.set_timing_cache(cache, ignore_mismatch=False)
    t0 = time.time()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT failed to build the engine (see the log above)")
    tmp = engine_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(serialized)
    os.replace(tmp, engine_path)
    if cache is not None:
        with open(timing_cache + ".tmp", "wb") as f:
            f.write(config.get_timing_cache().serialize())
        os.replace(timing_cache + ".tmp", timing_cache)
    log("built %s in %.1f s (TensorRT %s, %s)" % (engine_path, time.time() - t0, trt.__version__, precision))
    return engine_path


class TensorRTModel(object):
    def __init__(self, engine_path):
        import tensorrt as trt

        self.trt = trt
        self.kind, self.cuda = _cuda()
        logger = trt.Logger(trt.Logger.WARNING)
        with open(engine_path, "rb") as f:
            self.engine = trt.Runtime(logger).deserialize_cuda_engine(f.read())
        if self.engine is None:
            raise RuntimeError("cannot load %s: built for another GPU or TensorRT version; rebuild it" % engine_path)
        self.context = self.engine.create_execution_context()
        self.name = "TensorRT %s" % trt.__version__
        self.v3 = hasattr(self.engine, "num_io_tensors")
        self.io = []  # (name, is_input, shape, dtype, device_ptr, host)
        names = ([self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)] if self.v3
                 else [self.engine.get_binding_name(i) for i in range(self.engine.num_bindings)])
        for i, n in enumerate(names):
            if self.v3:
                is_in = self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT
                shape, dt = tuple(self.engine.get_tensor_shape(n)), self.engine.get_tensor_dtype(n)
            else:
                is_in = self.engine.binding_is_input(i)
                shape, dt = tuple(self.engine.get_binding_shape(i)), self.engine.get_binding_dtype(i)
            host = np.empty(shape, dtype=trt.nptype(dt))
            ptr = self._malloc(host.nbytes)
            self.io.append((n, is_in, shape, host.dtype, ptr, host))
            if self.v3:
                self.context.set_tensor_address(n, int(ptr))
        self.stream = self._stream()

    def _malloc(self, nbytes):
        if self.kind == "pycuda":
            return self.cuda.mem_alloc(nbytes)
        return _check(self.cuda.cudaMalloc(nbytes))

    def _stream(self):
        if self.kind == "pycuda":
            return self.cuda.Stream()
        return _check(self.cuda.cudaStreamCreate())

    def _copy(self, dst, src, nbytes, to_device):
        if self.kind == "pycuda":
            if to_device:
                self.cuda.memcpy_htod(dst, src)
            else:
                self.cuda.memcpy_dtoh(dst, src)
            return
        kind = (self.cuda.cudaMemcpyKind.cudaMemcpyHostToDevice if to_device
                else self.cuda.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        hptr = src.ctypes.data if to_device else dst.ctypes.data
        _check(self.cuda.cudaMemcpy(dst if to_device else hptr, hptr if to_device else src, nbytes, kind))

    def __call__(self, feeds):
        for name, is_in, shape, dtype, ptr, host in self.io:
            if is_in:
                arr = np.ascontiguousarray(feeds[name], dtype=dtype).reshape(shape)
                self._copy(ptr, arr, arr.nbytes, True)
        if self.v3:
            handle = self.stream.handle if self.kind == "pycuda" else int(self.stream)
            self.context.execute_async_v3(handle)
            if self.kind == "pycuda":
                self.stream.synchronize()
            else:
                _check(self.cuda.cudaStreamSynchronize(self.stream))
        else:
            self.context.execute_v2([int(io[4]) for io in self.io])
        outs = []
        for name, is_in, shape, dtype, ptr, host in self.io:
            if not is_in:
                self._copy(host, ptr, host.nbytes, False)
                outs.append(host.copy())
        return outs


def load_runtime(bundle, manifest, runtime, log):
    model_file = os.path.join(bundle, manifest["artifact"]["primary"])
    if runtime in ("auto", "tensorrt"):
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            if runtime == "tensorrt":
                raise RuntimeError("tensorrt does not import here; on a Jetson it comes with JetPack "
                                   "(python3-libnvinfer), or run with --runtime onnxruntime")
        else:
            engine = os.path.join(bundle, "model.engine")
            if not os.path.exists(engine):
                build_engine(model_file, engine, manifest["precision"],
                             timing_cache=os.path.join(bundle, "timing.cache"), log=log)
            return TensorRTModel(engine)
    return OnnxRuntimeModel(model_file)


# ----------------------------------------------------------------- smoke


def main(argv=None):
    ap = argparse.ArgumentParser(description="edgekit smoke test for a Jetson bundle")
    ap.add_argument("--bundle", default=HERE, help="bundle folder (default: this script's folder)")
    ap.add_argument("--runtime", choices=["auto", "tensorrt", "onnxruntime"], default="auto")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--output", default=None, help="smoke_result.json path (default: in the bundle)")
    ap.add_argument("--build-only", action="store_true", help="build model.engine and exit")
    args = ap.parse_args(argv)

    bundle = os.path.abspath(args.bundle)
    try:
        manifest = read_manifest(bundle)
    except (OSError, ValueError) as exc:
        log("cannot read manifest.json: %s" % exc)
        return 2
    if args.build_only:
        build_engine(os.path.join(bundle, manifest["artifact"]["primary"]), os.path.join(bundle, "model.engine"),
                     manifest["precision"], timing_cache=os.path.join(bundle, "timing.cache"), log=log)
        return 0

    smoke = Smoke(bundle, manifest, args.output or os.path.join(bundle, "smoke_result.json"))
    model = None
    if smoke.integrity():
        try:
            model = load_runtime(bundle, manifest, args.runtime, log)
            smoke.loaded(model.name)
        except Exception as exc:  # report any runtime failure as a failed check
            smoke.add("load", False, "%s: %s" % (type(exc).__name__, exc))
    if model is not None:
        golden = np.load(os.path.join(bundle, manifest["golden"]["file"]))
        smoke.golden(model, golden)
        feed = golden_feeds(golden, manifest)[0]  # one run's inputs, each on its batch axis
        rails = find_power_rails()
        sampler = PowerSampler(rails) if rails else None
        if sampler:
            sampler.__enter__()
        try:
            smoke.latency(lambda: model(feed), args.warmup, args.iters)
        finally:
            if sampler:
                sampler.__exit__()
        smoke.memory()
        if sampler and sampler.samples:
            smoke.power(float(np.mean(sampler.samples)), len(sampler.samples), "INA3221")
        else:
            smoke.power(why_not="this machine exposes no INA3221 power rails")
    return smoke.finish(model is not None)


if __name__ == "__main__":
    sys.exit(main())
