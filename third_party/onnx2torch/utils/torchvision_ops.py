# Added by edgekit (not in onnx2torch 1.5.15): torchvision is imported where a NonMaxSuppression or RoiAlign
# node is converted, not when onnx2torch loads. PyPI's torchvision wheel is a CUDA build that fails to import
# beside CPU torch, and only these two converters use it.
from types import ModuleType


def torchvision_ops() -> ModuleType:
    try:
        from torchvision import ops  # pylint: disable=import-outside-toplevel
    except Exception:  # absent, or a CUDA build failing beside CPU torch
        from edgekit.errors import UnsupportedOpError  # pylint: disable=import-outside-toplevel

        raise UnsupportedOpError(
            'the model uses NonMaxSuppression / RoiAlign, which the ONNX -> torch bridge runs with torchvision '
            '(not importable here); convert it for --target jetson, or cut the post-processing off the graph'
        ) from None
    return ops
