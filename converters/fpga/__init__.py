"""FPGA fabric (converter "hls4ml"): power-of-two-scaled QONNX -> hls4ml HLS project, bit-exact C simulation.

1. quantize (``graph``, ``quant``): the whole float graph through brevitas' graph mode (power-of-two FlexML maps),
   PTQ, ``int8`` (8-bit weights/activations) or ``int4`` (4-bit weights/activations,
   8-bit input), power-of-two scales, quantized bias; exported as QONNX (``model.qonnx.onnx``): QONNX execution is
   the integer-exact reference.
2. estimate (``resources``): DSP/BRAM36/LUT/FF against the board for reuse factors 1, 2, 4, ...; the smallest that
   fits is used. An estimate until Vivado reports.
3. convert (``project``): hls4ml with per-layer precision inferred from the quantizers (``auto`` types: no layer can
   wrap), ``io_stream`` for CNNs, ``io_parallel`` for MLPs. Boards that hls4ml knows (pynq-z2) get the
   VivadoAccelerator backend (block design, AXI DMA, PYNQ driver); the others get the bare Vitis HLS IP with the
   board's part.
4. check (``csim``): the C simulation, compiled with g++, must be bit-exact against QONNX execution on the
   calibration samples; the host runner repeats the check on every input it sees (golden and eval sets). A mismatch
   names the first layer where it starts.

No bitstream is made here (that needs Vivado, hours of synthesis); ``build.sh`` in the bundle makes it where Vivado
is installed, and the manifest says so. ``--option`` (options.Hls4mlOptions): ``fpga_scales``.
"""
