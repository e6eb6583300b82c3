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
(:mod:`edgekit.converters.coreml.interpreter`); on macOS it runs Core ML ``predict``.

Options (:class:`edgekit.converters.coreml.options.CoreMLOptions`): ``weight_threshold`` (weights with fewer
elements stay fp16; coremltools' 2048 unset) and ``fp32_ops`` (the ops a W8A8 / fp16 rebuild keeps fp32, as the
first build measured them: mixed precision's rebuilds write it).

Modules: ``converter`` (``CONVERTER``), ``mlprogram`` (torch -> ML program), ``compression`` (the precisions),
``fp16`` (the ops an fp16 program keeps fp32), ``w8a8`` (PT2E W8A8 off macOS), ``search`` (mixed-precision
hooks), ``checks`` (the Linux checks), ``mil`` (reading the program), ``interpreter`` / ``kernels`` (the host
MIL interpreter).
"""
