"""A ``.tflite`` flatbuffer read (and written back) through LiteRT's schema: the one place that
decodes operator names, tensor names and types and tells constants from activations, for the
analyze stage (Keras input) and the android converter's audit and rewrites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgekit.deps import require


def text(name: Any) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


class TFLiteGraph:
    """The model (object API, mutable) and its first subgraph."""

    def __init__(self, path: str | Path) -> None:
        self.schema = s = require("ai_edge_litert.schema_py_generated", "android")
        self.model = s.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
        self.sg = self.model.subgraphs[0]
        self.type_names = {v: k for k, v in vars(s.TensorType).items() if not k.startswith("_")}
        self._op_names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}

    def op_name(self, op: Any) -> str:
        """Builtin name (``CONV_2D``), or ``CUSTOM:<code>``."""
        oc = self.model.operatorCodes[op.opcodeIndex]
        name = self._op_names.get(max(oc.builtinCode, oc.deprecatedBuiltinCode), "CUSTOM")
        if name == "CUSTOM" and oc.customCode:
            name = f"CUSTOM:{text(oc.customCode)}"
        return name

    def operators(self) -> list[tuple[str, list[int], list[int]]]:
        """(op name, input tensor indices without the absent ones, output tensor indices), in execution order."""
        return [(self.op_name(op), [int(i) for i in (op.inputs if op.inputs is not None else []) if i >= 0],
                 [int(o) for o in (op.outputs if op.outputs is not None else [])]) for op in self.sg.operators]

    def tensor_name(self, i: int) -> str:
        return text(self.sg.tensors[i].name)

    def type_name(self, i: int) -> str:
        return self.type_names.get(self.sg.tensors[i].type, "")

    def is_const(self, i: int) -> bool:
        """Constants (weights, biases, shapes) have a buffer with data; activations do not."""
        b = self.sg.tensors[i].buffer
        if not 0 < b < len(self.model.buffers):
            return False
        buf = self.model.buffers[b]
        return (buf.data is not None and len(buf.data) > 0) or bool(getattr(buf, "size", 0))

    def opcode(self, code: int, version: int) -> int:
        """The index of builtin operator ``code`` in the model's operator codes (added where absent), its version
        raised to at least ``version``: what a rewrite that inserts an op (DEQUANTIZE, QUANTIZE) names it by."""
        for i, oc in enumerate(self.model.operatorCodes):
            if max(oc.builtinCode, oc.deprecatedBuiltinCode) == code:
                oc.version = max(oc.version, version)
                return i
        oc = self.schema.OperatorCodeT()
        oc.builtinCode, oc.deprecatedBuiltinCode, oc.version = code, min(code, 127), version
        self.model.operatorCodes.append(oc)
        return len(self.model.operatorCodes) - 1

    def save(self, path: str | Path) -> None:
        flatbuffers = require("flatbuffers", "android")
        b = flatbuffers.Builder(1024)
        b.Finish(self.model.Pack(b), file_identifier=b"TFL3")
        Path(path).write_bytes(bytes(b.Output()))
