"""The android target (Android / Linux-ARM): a ``.tflite`` model written by litert-torch (torch input) or by
TensorFlow's TFLiteConverter (Keras / SavedModel input), verified in LiteRT.

torch input (.pt2, TorchScript, factory):

fp32           litert-torch straight from the torch.export program (no TensorFlow).
fp16           fp32 model with fp16 conv/linear weights (ai-edge-quantizer FLOAT_CASTING,
               explicit DEQUANTIZE): half the weight bytes, float compute, float I/O.
int8-dynamic   PT2E dynamic config: int8 per-channel weights, activations quantized at run
               time inside the kernels (no calibration), float I/O.
int8           full integer: PT2E static config (per-channel symmetric int8 weights,
               per-tensor affine int8 activations, HistogramObserver ranges calibrated on
               --calib), int8 input and output tensors. litert-torch's add/mul annotators miss
               nodes of a program loaded from .pt2 (no source_fn_stack), and residual ADDs
               (MobileNetV2 blocks) then stay float between DEQUANTIZE and QUANTIZE; edgekit
               annotates every binary ``aten.add``/``aten.mul`` itself, and audits every
               op's tensor types after converting: a float op fails the build with the op
               list unless ``allow_float_fallback`` is set.

Keras (.keras / .h5) and SavedModel input (TensorFlow only needed here, ``edgekit[keras]``):
  Keras models are exported with ``keras.export.ExportArchive`` at the fixed input shapes, a
  SavedModel's ``serving_default`` is traced at them; ``tf.lite.TFLiteConverter`` then writes
fp32           the float model (BatchNorm folded, activations fused), NHWC as the model.
fp16           ``supported_types=[tf.float16]``: fp16 weights, DEQUANTIZE to fp32 compute.
int8-dynamic   ``Optimize.DEFAULT`` without data: int8 weights (tensors of >= 1024 elements;
               TensorFlow keeps smaller ones float), activations quantized at run time.
int8           full integer: ``representative_dataset`` from --calib, ``TFLITE_BUILTINS_INT8``,
               int8 input/output; the same audit, TRANSPOSE count and ``io=float`` rewrite.

Options (``--option key=value``):
  ``io=float``                  int8 with float32 input/output tensors (QUANTIZE/DEQUANTIZE at the
                                edges; the int8 scale/zero point stay in the manifest)
  ``layout=nhwc``               NHWC input/output, no TRANSPOSE at the edges (the host verifier
                                transposes the NCHW golden data)
  ``allow_float_fallback=true`` accept ops that stay float in an int8 build (warns)
  ``activations=int16``         int8 with 16-bit activations (TFLite's "16x8" mode: int8 per-channel
                                weights, int16 symmetric activations and I/O), written by
                                ai-edge-quantizer from the fp32 .tflite with min/max ranges over every
                                --calib batch. Far closer to float than int8 activations, and slower:
                                XNNPACK has no int16 kernels, LiteRT runs its reference ones. Mixed
                                precision tries it last where an int8 build fails verification.
  ``keep_float_tensors=a,b``    with activations=int16: ops kept float in the 16x8 model, named by their
                                output tensor in the fp32 .tflite (what the 16x8 layer search keeps)
  ``threads=N`` (host interpreter threads for verification, default 2).

One concern a module: :mod:`.converter` (the build a job asks for, its audit and report), :mod:`.options`,
:mod:`.build` (fp32 / fp16 / PT2E builds through litert-torch), :mod:`.quantizer` and :mod:`.int8_rewrites`
(the PT2E quantizer and the int8 graph rewrites), :mod:`.a16` (the 16x8 build), :mod:`.audit` (the written
flatbuffer's ops), :mod:`.interpreter` (LiteRT on the host), :mod:`.search` (the mixed-precision hooks).
"""
