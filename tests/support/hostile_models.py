"""Hostile model files: the digits .pt2 with members replaced, flipped or cut short, finetune records that name
a user's file, and TensorFlow models that touch files or hold Python (a SavedModel, a Keras Lambda)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

from hostile_data import DIGITS

MODEL = DIGITS / "digits_cnn.pt2"
PREFIX = "digits_cnn/"


# ---------------------------------------------------------------- .pt2 surgery


def members(path: Path = MODEL) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def write_zip(dest: Path, files: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(dest, "w", compress) as zf:
        for n, data in files.items():
            zf.writestr(n, data)
    return dest


def pt2_with(dest: Path, **changes: bytes | None) -> Path:
    """The digits .pt2 with members replaced (name relative to the archive folder; None drops it)."""
    files = members()
    for short, data in changes.items():
        key = PREFIX + short.replace("__", "/")
        if data is None:
            files.pop(key, None)
        else:
            files[key] = data
    return write_zip(dest, files)


def model_json(edit: Callable[[dict], None]) -> bytes:
    doc = json.loads(members()[PREFIX + "models/model.json"])
    edit(doc)
    return json.dumps(doc).encode()


def finetune_record_naming(s: Path, v: Path, m: Path) -> Path:
    """The digits .pt2 with an `edgekit finetune` record that names a file of the victim's as its original."""
    (v / "secret.onnx").write_bytes(b"the victim's own file, not a model")
    record = {"finetuned_from": {"path": str(v / "secret.onnx"), "abspath": 7, "sha256": 12}, "data_samples": 5,
              "recipe": "not a dict"}
    return pt2_with(s / "m.pt2", **{"extra__edgekit-finetune.json": json.dumps(record).encode()})


def finetune_record_wild_ranges(s: Path, v: Path, m: Path) -> Path:
    """A jetson finetune record whose activation ranges are +-1e30 and whose original is a file of the victim's: with
    ``--option student_ranges=on`` the ranges are imposed (numbers are numbers), the victim's file is not read as a
    model, and the build is checked against its own weights, where it fails."""
    (v / "secret.onnx").write_bytes(b"the victim's own file, not a model")
    record = {"finetuned_from": {"path": str(v / "secret.onnx"), "abspath": str(v / "secret.onnx"), "sha256": "0" * 64},
              "recipe": {"target": "jetson"}, "activation_ranges": [[-1e30, 1e30]] * 5}
    return pt2_with(s / "m.pt2", **{"extra__edgekit-finetune.json": json.dumps(record).encode()})


def flip_byte(src: Path, dest: Path, member: str) -> Path:
    """Flip one byte of a member's data in place; the zip's CRC is left as it was."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        info = zf.getinfo(member)
    off = info.header_offset  # the local header's own name and extra lengths (they may differ from the central ones)
    name_len, extra_len = int.from_bytes(data[off + 26:off + 28], "little"), int.from_bytes(data[off + 28:off + 30], "little")
    start = off + 30 + name_len + extra_len
    data[start + min(10, info.file_size - 1)] ^= 0xFF
    dest.write_bytes(bytes(data))
    return dest


def weights_config_pickled(name: str) -> bytes:
    cfg = json.loads(members()[PREFIX + "data/weights/model_weights_config.json"])
    cfg["config"][name]["use_pickle"] = True
    return json.dumps(cfg).encode()


# ---------------------------------------------------------------- TensorFlow / Keras


def saved_model_touching_files(dest: Path, marker: Path, read: Path | None = None) -> Path:
    """A SavedModel whose serving function writes ``marker`` (or reads ``read``) when it runs."""
    import tensorflow as tf

    class M(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable(tf.ones([4, 2]))

        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
        def serve(self, x):
            if read is not None:
                x = x + tf.cast(tf.strings.length(tf.io.read_file(str(read))), tf.float32) * 0.0
            else:
                tf.io.write_file(str(marker), "payload ran")
            return {"y": tf.matmul(x, self.w)}

    m = M()
    tf.saved_model.save(m, str(dest), signatures={"serving_default": m.serve})
    return dest


def keras_with_lambda(dest: Path, marker: Path) -> Path:
    import keras

    path = str(marker)

    def payload(t):
        open(path, "w").write("payload ran")  # noqa: SIM115 - runs only if Keras deserializes the lambda
        return t * 2

    inp = keras.Input((4,))
    keras.Model(inp, keras.layers.Lambda(lambda t: payload(t))(inp)).save(dest)
    if marker.exists():
        marker.unlink()  # written while building; the case checks that loading does not write it again
    return dest
