"""YOLO detection heads found in an ONNX graph, so that verification judges them as detections by default.

A detector's raw output is mostly background: thousands of anchors whose boxes no user ever reads. Judged as a
``regression`` output, its max error is set by a background box (a YOLOv8n's int8 build failed at 26.5% of the
range while detecting the same objects). The ``detection`` kinds judge what a user of the detector reads: the
anchors that reach the confidence threshold, and their boxes (firmware/common/edgekit_smoke.check_output).

Recognised here, by graph structure and shape, and confirmed on the float outputs:

- ``detection_cf``: the anchor-free head of YOLOv8 / YOLO11 as Ultralytics exports it, ``Concat(axis=1)`` of the
  decoded boxes (4 channels) and ``Sigmoid`` class scores, [N, 4 + C, anchors] with more anchors than channels.
- ``detection``: the anchor-based head of YOLOv5 / YOLOv7 / YOLOX exports, [N, anchors, 4 box + objectness + C]:
  made by a ``Concat`` (through Reshape / Transpose) whose inputs come from ``Sigmoid`` within a few nodes, the
  boxes in pixels (some value past 1) and the objectness and class scores in [0, 1].
"""

from __future__ import annotations

import numpy as np


def detection_heads(proto, outputs: dict[str, np.ndarray]) -> dict[str, str]:
    """Output name -> detection kind for the outputs of ``proto`` (an onnx ModelProto) that are YOLO heads;
    ``outputs`` holds the float values of the graph's outputs (the golden samples), by name."""
    graph = proto.graph
    producer = {o: n for n in graph.node for o in n.output}
    channels = _channels(proto)
    found = {}
    for name, ref in outputs.items():
        node = producer.get(name)
        ref = np.asarray(ref)
        if node is None or ref.dtype.kind != "f" or ref.ndim != 3 or ref.size == 0:
            continue
        if _anchor_free(node, producer, channels, ref):
            found[name] = "detection_cf"
        elif _anchor_based(node, producer, ref):
            found[name] = "detection"
    return found


PASSING = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def _anchor_based(node, producer, ref) -> bool:
    """[N, anchors, 5 + C] assembled by a Concat (behind Reshape / Transpose) whose every input reaches a
    ``Sigmoid`` within :data:`DEPTH` nodes; columns 4.. in [0, 1], the boxes with some value past 1 (pixels)."""
    if ref.shape[2] < 6 or ref.shape[1] <= ref.shape[2]:
        return False
    scores = ref[:, :, 4:]
    if scores.min() < 0.0 or scores.max() > 1.0 or ref[:, :, :4].max() <= 1.0:
        return False
    while node is not None and node.op_type in PASSING:
        node = producer.get(node.input[0])
    if node is None or node.op_type != "Concat":
        return False
    return all(_sigmoid_within(producer.get(i), producer, DEPTH) for i in node.input)


DEPTH = 8


def _sigmoid_within(node, producer, depth: int) -> bool:
    """A ``Sigmoid`` among ``node`` and its producers up to ``depth`` nodes back."""
    if node is None or depth < 0:
        return False
    if node.op_type == "Sigmoid":
        return True
    return any(_sigmoid_within(producer.get(i), producer, depth - 1) for i in node.input)


def _anchor_free(node, producer, channels, ref) -> bool:
    """``Concat(axis=1)`` of a 4-channel box tensor and Sigmoid scores, [N, 4 + C, anchors], scores in [0, 1]."""
    if node.op_type != "Concat" or len(node.input) != 2:
        return False
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    if axis not in (1, -2):
        return False
    box, scores = node.input
    if getattr(producer.get(scores), "op_type", None) != "Sigmoid":
        return False
    if channels.get(box, 4) != 4 or ref.shape[1] < 5 or ref.shape[2] <= ref.shape[1]:
        return False
    cls = ref[:, 4:, :]
    return bool(cls.min() >= 0.0 and cls.max() <= 1.0)


def _channels(proto) -> dict[str, int]:
    """Axis 1 of each 3-D tensor whose shape the graph records (value_info after shape inference)."""
    out = {}
    for vi in list(proto.graph.value_info) + list(proto.graph.output):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if len(dims) == 3 and dims[1].HasField("dim_value"):
            out[vi.name] = int(dims[1].dim_value)
    return out
