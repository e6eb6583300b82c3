"""Jetson / TensorRT: a TensorRT-ready ONNX (fp32, fp16, or INT8 with explicit Q/DQ).

fp32   exported ONNX, cleaned with onnxslim.
fp16   weights stored as fp16 (onnxruntime's float16 converter), fp32 I/O kept; the engine is built with ``--fp16``.
int8   onnxruntime.quantization ``quantize_static`` in QDQ format: symmetric INT8, per-channel weights, activation
       ranges calibrated on the calibration set by the method that measures best on this model
       (``calibration=auto``: min-max, percentile 99.999 / 99.99, entropy with TensorRT's bin settings and MSE,
       each method's output SNR against float on calibration samples, measured on one simulated INT8 graph), or
       the one given. Where the build fails verification, mixed precision leaves the fewest sensitive nodes out of
       Q/DQ, searched on the same simulated graph; only the chosen set is built for real and verified. TensorRT reads the Q/DQ pairs
       directly (explicit quantization), so no calibrator runs on the board.

``--option`` (options.TensorRTOptions): ``calibration``, ``qdq`` (Q/DQ placement), ``keep_float_nodes``,
``bias_correction``, ``equalize`` (depthwise equalization), ``student_ranges`` (a fine-tuned student's ranges).

Where ``tensorrt`` imports and a GPU is present, the engine is built here too (with a timing cache); otherwise the
bundle's ``build_engine.sh`` builds it on the board.

Modules: converter (the converter and its hooks), quantize (the INT8 build), qdq (Q/DQ placement and writing),
calibration (the calibration methods), bias (bias correction), equalize (depthwise equalization), student (a
fine-tuned student's ranges), simulate (the simulated INT8 graph: nodes switched and scales set by graph inputs),
search (the mixed-precision layer search), engine (the TensorRT engine).
"""
