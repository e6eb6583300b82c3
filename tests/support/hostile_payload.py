"""The payload of the hostile-input corpus: a pickle whose loading creates a marker file, proof that code from
the file ran."""

from __future__ import annotations

import io
import pickle
from pathlib import Path


class Payload:
    """Unpickling this creates the marker file: proof that code from the file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=2)


def evil_torch_save(marker: Path) -> bytes:
    """A ``torch.save`` zip (the format of a .pt2's sample_inputs and pickled weights) holding the payload."""
    import torch

    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    return buf.getvalue()
