"""PYNQ driver for an edgekit fabric overlay (hls4ml VivadoAccelerator, AXI-stream + AXI DMA).

Runs on the board (PYNQ image: Python 3, numpy, pynq). The overlay's top level takes float32
words on its AXI stream and converts them to the input quantizer's fixed-point type, so the
DMA buffers hold float32 values that are already on the input grid (fabric_golden.npz holds
such inputs). Python 3.6 syntax.
"""

import os
import time

import numpy as np


class FabricDriver(object):
    """Loads ``overlay.bit`` (+ ``overlay.hwh`` beside it) and streams one sample per call."""

    def __init__(self, bitfile, n_in, n_out, dma_name="axi_dma_0"):
        from pynq import Overlay, allocate  # on the board only

        if not os.path.isfile(bitfile):
            raise IOError("%s missing: run ./build.sh where Vivado is installed, copy the bundle again" % bitfile)
        hwh = os.path.splitext(bitfile)[0] + ".hwh"
        if not os.path.isfile(hwh):
            raise IOError("%s missing: PYNQ needs the .hwh beside the .bit (build.sh copies both)" % hwh)
        self.overlay = Overlay(bitfile)
        self.dma = getattr(self.overlay, dma_name)
        self.inp = allocate(shape=(n_in,), dtype=np.float32)
        self.out = allocate(shape=(n_out,), dtype=np.float32)
        self.name = "pynq Overlay %s (DMA %s)" % (os.path.basename(bitfile), dma_name)

    def infer(self, x):
        self.inp[:] = np.asarray(x, dtype=np.float32).reshape(-1)
        self.inp.flush()
        self.dma.sendchannel.transfer(self.inp)
        self.dma.recvchannel.transfer(self.out)
        self.dma.sendchannel.wait()
        self.dma.recvchannel.wait()
        self.out.invalidate()
        return np.array(self.out, dtype=np.float32)

    def close(self):
        for buf in (self.inp, self.out):
            try:
                buf.freebuffer()
            except Exception:
                pass


def timed(driver, x, iters):
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        driver.infer(x)
        times.append((time.perf_counter() - t0) * 1000.0)
    return times
