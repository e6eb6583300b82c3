"""Fabric resources before synthesis: an ESTIMATE of DSP, BRAM36, LUT and FF from the model.

The rules (hls4ml's dataflow architecture, one multiplier per weight shared over the reuse
factor R):
- multipliers per layer = ceil(weights / R); a product of >= 9-bit operands goes to a DSP48
  slice, narrower products are built from LUTs (about w_bits x a_bits / 2 LUTs each);
- each multiplier feeds an adder tree of accumulator width (one LUT per bit), plus one
  register per bit (FF);
- with R > 1 (Resource strategy) the weights live in BRAM: ceil(weight bits / 36 Kib) per
  layer, at least one per layer; with R = 1 they are constants in logic;
- io_stream FIFOs between layers hold one feature map each: BRAM36 when above 1 Kib;
- the PYNQ shell (AXI DMA, interconnect, reset) costs a fixed ~6,000 LUT / 8,000 FF / 3 BRAM36.
Vivado's synthesis report replaces these figures; until it runs they are labelled estimates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

SHELL = {"lut": 6000, "ff": 8000, "bram36": 3, "dsp": 0}  # AXI DMA + SmartConnect + reset (PYNQ base designs)
BRAM_BITS = 36 * 1024
FIT_SHARE = 0.8  # leave 20% of the fabric for routing and timing closure
# streamed tensors per op of the float graph: a conv's output, an activation's output and its requantized copy
# (measured against the build's QONNX streams: 26 for ResNet-8's 30, 27 for the KWS DS-CNN's 29)
FIFO_OPS = {"Conv": 1, "Relu": 2, "Clip": 2, "LeakyRelu": 2, "MaxPool": 1, "AveragePool": 1, "Add": 1, "Concat": 1,
            # TFLite graphs (Keras models) fuse the activation into the conv: its three streams
            "CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "MAX_POOL_2D": 1, "AVERAGE_POOL_2D": 1, "ADD": 1,
            "CONCATENATION": 1}
REUSE_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class FabricLayer:
    name: str
    weights: int
    w_bits: int
    a_bits: int
    out_elems: int
    kernel: int = 0  # a depthwise conv's window (kh x kw); 0 for other layers
    pixels: int = 1  # positions a streamed conv computes (input height x width); 1 for a dense layer

    def reuse(self, reuse: int) -> int:
        """The layer's reuse factor at the model's ``reuse``: a depthwise conv runs hls4ml's Latency strategy (its
        Resource strategy computes wrong results in io_stream, measured), whose reuse must divide the window."""
        if not self.kernel:
            return reuse
        return max(d for d in range(1, self.kernel + 1) if self.kernel % d == 0 and d <= reuse)


@dataclass
class FabricEstimate:
    reuse_factor: int
    dsp: int
    bram36: int
    lut: int
    ff: int
    fits: bool
    limiting: str | None  # resource that does not fit, if any
    utilization: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": "estimate (before synthesis; Vivado's report replaces it)"}


def estimate(costs: list[FabricLayer], reuse: int, fpga, io_stream: bool,
             fifo_bits: list[int] | None = None) -> FabricEstimate:
    dsp = lut = ff = bram = 0
    for c in costs:
        r = c.reuse(reuse)
        mults = math.ceil(c.weights / r)
        acc_bits = c.w_bits + c.a_bits + math.ceil(math.log2(max(2, c.weights // max(1, c.out_elems))))
        if max(c.w_bits, c.a_bits) >= 9:
            dsp += mults
        else:
            lut += mults * math.ceil(c.w_bits * c.a_bits / 2)
        lut += mults * acc_bits  # adder tree
        ff += mults * acc_bits
        if r > 1 and not c.kernel:  # the Resource strategy keeps weights in BRAM
            bram += max(1, math.ceil(c.weights * c.w_bits / BRAM_BITS))
    if io_stream:
        for b in fifo_bits or []:
            if b > 1024:
                bram += math.ceil(b / BRAM_BITS)
            else:
                lut += math.ceil(b / 32)  # SRL-based shallow FIFO
    dsp += SHELL["dsp"]
    lut += SHELL["lut"]
    ff += SHELL["ff"]
    bram += SHELL["bram36"]
    avail = {"dsp": fpga.dsp, "bram36": fpga.bram36, "lut": fpga.lut, "ff": fpga.ff}
    used = {"dsp": dsp, "bram36": bram, "lut": lut, "ff": ff}
    util = {k: round(used[k] / avail[k], 4) if avail[k] else float("inf") for k in used}
    over = [k for k in used if used[k] > FIT_SHARE * avail[k]]
    return FabricEstimate(reuse, dsp, bram, lut, ff, not over, over[0] if over else None, util)


def timing(costs: list[FabricLayer], reuse: int, clock_mhz: float, io_stream: bool) -> dict[str, Any]:
    """ESTIMATED latency and initiation interval in clock cycles (and µs at ``clock_mhz``), before HLS synthesis.

    A dense layer takes its reuse factor in cycles plus its adder tree (log2 of its inputs) and two register
    stages; a streamed conv reads one input pixel per reuse-factor cycles (hls4ml's line buffer), so it takes
    pixels x reuse cycles. The layers are counted one after the other (latency: an upper bound; hls4ml's dataflow
    overlaps streamed layers), and the slowest layer sets the interval between inferences."""
    per = []
    for c in costs:
        r = c.reuse(reuse)
        fan_in = max(2, c.weights // max(1, c.out_elems))
        cycles = c.pixels * r + math.ceil(math.log2(fan_in)) + 2 if io_stream else (
            r + math.ceil(math.log2(fan_in)) + 2)
        per.append({"layer": c.name, "reuse_factor": r, "cycles": int(cycles)})
    latency = sum(p["cycles"] for p in per)
    interval = max((p["cycles"] for p in per), default=0)
    return {"kind": "estimate (before HLS synthesis; hls4ml reports its own after `build.sh`'s csynth)",
            "clock_mhz": clock_mhz, "latency_cycles": latency, "latency_us": round(latency / clock_mhz, 3),
            "interval_cycles": interval, "interval_us": round(interval / clock_mhz, 3),
            "inferences_per_s": round(clock_mhz * 1e6 / interval) if interval else None, "layers": per}


def pick_reuse(costs: list[FabricLayer], fpga, io_stream: bool, fifo_bits: list[int] | None = None,
               choices: tuple[int, ...] = REUSE_CHOICES) -> tuple[FabricEstimate, list[FabricEstimate]]:
    """Smallest reuse factor whose estimate fits the board (<= 80% of every resource)."""
    tried = []
    for r in choices:
        est = estimate(costs, r, fpga, io_stream, fifo_bits)
        tried.append(est)
        if est.fits:
            return est, tried
    return tried[-1], tried


POOL_OPS = ("GlobalAveragePool", "AveragePool")
TFLITE_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def layers_from_stats(stats, bits: int) -> list[FabricLayer]:
    """The compute layers of the float graph's analysis (:class:`edgekit.analyze.ModelStats`) as fabric layers,
    for ``edgekit plan``: weights = MACs / output positions, a depthwise conv's window = its weights per channel,
    the pixels a streamed conv reads = its input's height x width.
    The first layer reads the 8-bit input (the DMA word); the others read ``bits``-bit activations."""
    out: list[FabricLayer] = []
    for lay in stats.layers:
        ins = [int(d) for d in lay.input_shape if isinstance(d, int)]
        shape = [int(d) for d in lay.output_shape if isinstance(d, int)]
        if lay.op == "ReduceMean" and len(ins) in (3, 4) and math.prod(shape[2:]) == 1 and shape[:2] == ins[:2]:
            lay_op = "GlobalAveragePool"  # x.mean((2, 3)): the build rewrites it into one
        else:
            lay_op = lay.op
        if lay_op in POOL_OPS and len(ins) in (3, 4):  # the build's depthwise conv with weights 1/k
            k = max(1, math.prod(ins[2:]) // max(1, math.prod(shape[2:]) if lay_op == "AveragePool" else 1))
            out.append(FabricLayer(lay.name, ins[1] * k, bits, bits, ins[1], k, math.prod(ins[2:])))
            continue
        if lay.op in TFLITE_OPS:  # a Keras model's graph (TFLite): channels-last, activations fused
            conv, last = lay.op != "FULLY_CONNECTED" and len(shape) == 4, True
            depthwise = lay.op == "DEPTHWISE_CONV_2D"
        elif lay.op in ("Conv", "Gemm", "MatMul"):
            conv, last = lay.op == "Conv" and len(shape) >= 3, False
            depthwise = conv and lay.groups > 1
        else:
            continue
        if not lay.macs:
            continue
        space = (shape[1:3] if last else shape[2:]) if conv else []
        positions = int(math.prod(space))
        outs = int(shape[-1] if last or not conv else shape[1]) if shape else 1
        # a streamed conv reads its input's pixels (ONNX graphs record the input shape; TFLite's: its output's)
        pixels = int(math.prod(ins[2:])) if conv and not last and len(ins) == len(shape) else positions
        weights = max(1, int(lay.macs // max(1, positions)))
        kernel = weights // max(1, outs) if depthwise else 0
        out.append(FabricLayer(lay.name, weights, bits, 8 if not out else bits, outs, kernel, pixels))
    return out


def plan_estimate(stats, bits: int, fpga) -> dict[str, Any] | None:
    """Fit and timing of the float graph on ``fpga`` before anything is built: the smallest reuse factor that fits
    (or the largest tried), the share of the fabric it takes and the estimated latency and interval; None for a
    graph with no compute layer the fabric would build."""
    costs = layers_from_stats(stats, bits)
    if not costs:
        return None
    io_stream = any(c.pixels > 1 for c in costs)
    # io_stream FIFOs: one feature map per streamed tensor (a conv's output and its requantized copy)
    fifos = [int(math.prod(lay.output_shape)) * bits for lay in stats.layers if io_stream and lay.op in FIFO_OPS
             and len(lay.output_shape) == 4 and all(isinstance(d, int) for d in lay.output_shape)
             for _ in range(FIFO_OPS[lay.op])]
    est, _ = pick_reuse(costs, fpga, io_stream, fifos)
    t = timing(costs, est.reuse_factor, fpga.fabric_clock_mhz, io_stream)
    return {"reuse_factor": est.reuse_factor, "fits": est.fits, "limiting": est.limiting,
            "share": max(est.utilization.values(), default=0.0), "estimate": est.to_json(),
            "latency_us": t["latency_us"], "interval_us": t["interval_us"], "latency_cycles": t["latency_cycles"],
            "interval_cycles": t["interval_cycles"], "layers": len(costs)}
