"""Hostile data files: .npz / .npy with bombs for headers, Python objects, and the digits calibration data every
bad variant starts from."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from hostile_payload import Payload

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"  # the example every crafted input (model, data, bundle) starts from


def npz(dest: Path, **arrays: np.ndarray) -> Path:
    with open(dest, "wb") as f:
        np.savez(f, **arrays)
    return dest


def digits_x(n: int = 32) -> np.ndarray:
    with np.load(DIGITS / "calib.npz") as z:
        return z[z.files[0]][:n].astype(np.float32)


def npy_header_bomb(dest: Path, samples: int) -> Path:
    """A .npy whose header claims ``samples`` digits images; the data is not there."""
    header = {"descr": "<f4", "fortran_order": False, "shape": (samples, 1, 8, 8)}
    with open(dest, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 1024)
    return dest


def npz_bomb(dest: Path, gib: float) -> Path:
    """A small deflated .npz whose one array expands to ``gib`` GiB of zeros (streamed, never in memory)."""
    n = int(gib * 2**30 / (64 * 4))
    header = {"descr": "<f4", "fortran_order": False, "shape": (n, 1, 8, 8)}
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf, \
            zf.open("x.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, header)
        block = b"\0" * (1 << 24)
        left = n * 64 * 4
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
    return dest


def object_npz(dest: Path, marker: Path) -> Path:
    arr = np.empty(1, dtype=object)
    arr[0] = Payload(marker)
    with open(dest, "wb") as f:
        np.savez(f, x=arr)
    return dest
