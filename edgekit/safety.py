"""No code from a file runs unless the user said ``--trust-pickle``.

A torch archive (``.pt2`` ExportedProgram, TorchScript, a ``torch.save`` zip) is inspected
member by member *before* torch reads it:

- the zip's CRCs are checked (a flipped byte in a weight is a damaged file, not a model);
- every member torch would unpickle (``*.pkl``, ``sample_inputs/*``, weights and constants
  stored with ``use_pickle``, nested ``torch.save`` zips) is scanned opcode by opcode with
  :mod:`pickletools` (nothing is executed): a global outside torch's own weights-only
  allowlist refuses the file, naming the member and the global;
- pickled Python objects that torch loads with plain ``pickle.loads`` (``opaque_obj*``
  constants) and torchbind objects (``custom_obj*``) are refused outright;
- symbolic-shape expressions in ``models/*.json`` (which torch parses with
  ``sympy.sympify``, i.e. ``eval``) must be plain arithmetic over shape symbols, and its
  ``guards_code`` lines (which ``ExportedProgram.module()`` ``exec``s) plain shape checks.

The same scanner checks TorchScript's ``data.pkl``/``constants.pkl``, where classes are
``__torch__.*`` names resolved by TorchScript's own type system, not by a Python import.
"""

from __future__ import annotations

import io
import json
import pickletools
import re
import zipfile
from collections.abc import Iterable
from functools import lru_cache
from typing import IO

from edgekit.errors import ModelLoadError

TRUST_FIX = "if you trust the file's source, pass --trust-pickle; otherwise re-save the model with torch.export.save"
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_PUT_OPS = {"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"}
_GET_OPS = {"GET", "BINGET", "LONG_BINGET"}
# TorchScript archives: classes live in TorchScript's type system, not in Python modules
_TORCHSCRIPT_PREFIXES = ("__torch__.", "torch.jit._pickle.")
_TORCHSCRIPT_EXTRA = {"torch._utils._rebuild_qtensor", "torch._utils._rebuild_sparse_tensor"}
# expressions torch.export's deserializer hands to sympy.sympify (an eval)
_EXPR_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z][A-Za-z0-9_]*)|(\*\*|//|[-+*/%(),<>=!]=?))")
_SYMBOL = re.compile(r"^[a-z]{1,4}\d+$")  # s0, u12, zuf3 ...
_SYMPY_NAMES = {
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv",
    "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv", "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "OpaqueUnaryFn_sqrt",
    "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not", "Piecewise", "oo", "True", "False",
    "Integer", "Rational", "Float", "floor", "ceiling", "sqrt",
}


@lru_cache(maxsize=1)
def torch_safe_globals() -> frozenset[str]:
    """The globals torch's weights-only unpickler accepts (its own allowlist, read from torch)."""
    import torch
    import torch._weights_only_unpickler as wou

    names = set(wou._get_allowed_globals())
    for obj in torch.serialization.get_safe_globals():
        obj = obj[0] if isinstance(obj, tuple) else obj
        names.add(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', ''))}")
    return frozenset(names)


def pickle_globals(data: bytes) -> list[str]:
    """Every global a pickle imports (``module.name``), read from its opcodes without running it.

    A ``STACK_GLOBAL`` whose operands are not plain strings is reported as ``<unresolved>``
    (treated as unsafe). Raises ValueError on a pickle that cannot be parsed."""
    found: list[str] = []
    recent: list[object] = []  # what the last ops pushed: a str, or None for anything else
    memo: dict[object, object] = {}
    try:
        for op, arg, _pos in pickletools.genops(data):
            name = op.name
            if name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", "."))
                recent.append(None)
            elif name == "STACK_GLOBAL":
                mod, qual = (recent[-2], recent[-1]) if len(recent) >= 2 else (None, None)
                found.append(f"{mod}.{qual}" if isinstance(mod, str) and isinstance(qual, str) else "<unresolved>")
                recent.append(None)
            elif name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else bytes(arg).decode("latin-1"))
            elif name in _PUT_OPS:
                memo[len(memo) if name == "MEMOIZE" else arg] = recent[-1] if recent else None
            elif name in _GET_OPS:
                recent.append(memo.get(arg))
            elif op.stack_after:
                recent.append(None)
            if name == "STOP":
                break
    except Exception as exc:  # noqa: BLE001 - pickletools raises ValueError and others on garbage
        raise ValueError(str(exc)) from None
    return found


def _unsafe(globals_: Iterable[str], torchscript: bool) -> list[str]:
    safe = torch_safe_globals()
    bad = []
    for g in globals_:
        if g in safe:
            continue
        if torchscript and (g.startswith(_TORCHSCRIPT_PREFIXES) or g in _TORCHSCRIPT_EXTRA):
            continue
        bad.append(g)
    return sorted(set(bad))


def check_sym_expr(text: str) -> bool:
    """True when ``text`` is plain arithmetic over shape symbols and sympy's integer functions."""
    pos = 0
    while pos < len(text):
        m = _EXPR_TOKEN.match(text, pos)
        if not m or m.end() == pos:
            return not text[pos:].strip()
        ident = m.group(2)
        if ident and not (_SYMBOL.match(ident) or ident in _SYMPY_NAMES):
            return False
        pos = m.end()
    return True


_GUARD_ATTRS = {"size", "stride", "storage_offset", "dim", "numel", "isnan", "inf", "pi"}
_GUARD_NAMES = {"L", "math", "inf"} | _SYMPY_NAMES


def check_guard(code: str) -> bool:
    """True when ``code`` (one of a .pt2's ``guards_code`` lines, which ``ExportedProgram.module()`` pastes into
    Python and ``exec``s) is a plain shape check such as ``L['x'].size()[0] <= 64``: comparisons, arithmetic and
    subscripts over ``L``, ``.size()``/``.stride()`` calls, numbers and strings; no other name, no dunder."""
    import ast

    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return False
    allowed = (ast.Expression, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Constant, ast.Name, ast.Load,
               ast.Subscript, ast.Attribute, ast.Call, ast.Tuple, ast.Slice, ast.cmpop, ast.boolop, ast.unaryop,
               ast.operator)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            return False
        if isinstance(node, ast.Name) and node.id not in _GUARD_NAMES:
            return False
        if isinstance(node, ast.Attribute) and node.attr not in _GUARD_ATTRS:
            return False
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__" in node.value:
            return False
        if isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, (ast.Attribute, ast.Name))):
            return False
    return True


def _sym_exprs(node: object) -> Iterable[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr_str" and isinstance(v, str):
                yield v
            elif k == "range_constraints" and isinstance(v, dict):
                yield from (str(key) for key in v)
                yield from _sym_exprs(v)
            else:
                yield from _sym_exprs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _sym_exprs(v)


# torch.export's serialized ScalarType -> bytes per element (torch/_export/serde/schema.py)
_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1, 13: 2, 28: 2,
             29: 1, 30: 1, 31: 1, 32: 1, 33: 1, 34: 4, 35: 8}


def _needed_bytes(meta: dict) -> int | None:
    """Bytes a raw (not pickled) tensor payload must hold, from its tensor_meta; None when it cannot tell."""
    try:
        tm = meta["tensor_meta"]
        item = _ITEMSIZE[int(tm["dtype"])]
        sizes = [int(s["as_int"]) for s in tm["sizes"]]
        strides = [int(s["as_int"]) for s in tm["strides"]]
        offset = int(tm.get("storage_offset", {}).get("as_int", 0))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if any(s == 0 for s in sizes):
        return 0
    return (offset + sum((n - 1) * st for n, st in zip(sizes, strides, strict=False)) + 1) * item


def _payload_configs(zf: zipfile.ZipFile, names: list[str], source: str) -> Iterable[tuple[str, str, dict]]:
    """(member, tensor name, payload meta) for every weight/constant a .pt2's ``*_config.json`` lists."""
    for n in names:
        if not n.endswith("_config.json") or "/data/" not in f"/{n}":
            continue
        try:
            cfg = json.loads(zf.read(n))
        except ValueError:
            raise ModelLoadError(f"{source}: member {n} is not valid JSON; the archive is damaged: re-export the model") from None
        base = n.rsplit("/", 1)[0]
        entries = cfg.get("config", {}) if isinstance(cfg, dict) else {}
        for fqn, meta in entries.items() if isinstance(entries, dict) else []:
            if isinstance(meta, dict):
                yield f"{base}/{meta.get('path_name', '')}", fqn, meta


def _check_payload_sizes(zf: zipfile.ZipFile, configs: list[tuple[str, str, dict]], source: str) -> None:
    """Every raw weight/constant member holds at least the bytes its tensor needs: a member cut short is named
    here (torch would only log warnings and fail with "check the warnings above")."""
    sizes = {i.filename: i.file_size for i in zf.infolist()}
    for member, fqn, meta in configs:
        if meta.get("use_pickle"):
            continue
        need = _needed_bytes(meta)
        if member not in sizes:
            raise ModelLoadError(f"{source}: the archive lacks member {member} (tensor {fqn}); the file is "
                                 "incomplete: re-export the model")
        if need is not None and sizes[member] < need:
            raise ModelLoadError(f"{source}: member {member} holds {sizes[member]:,} bytes, tensor {fqn} needs "
                                 f"{need:,}; the file is damaged or cut short: re-export the model")


def check_zip_end(f: IO[bytes], source: str) -> None:
    """A zip ends with its end-of-central-directory record (and the record's comment, if any). A file cut short
    loses it, yet zipfile (and torch) may still find another record inside a member's bytes and read a different,
    smaller archive: that surfaced as "holds pickled objects, pass --trust-pickle" instead of "truncated"."""
    f.seek(0, io.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - (22 + 0xFFFF)))
    tail = f.read()
    f.seek(0)
    at = tail.rfind(b"PK\x05\x06")
    while at >= 0:
        comment = int.from_bytes(tail[at + 20:at + 22], "little") if at + 22 <= len(tail) else -1
        if at + 22 + comment == len(tail):
            return
        at = tail.rfind(b"PK\x05\x06", 0, at)
    raise ModelLoadError(
        f"{source}: truncated or corrupt: a zip whose central directory is missing (its last bytes are not a zip's "
        "end record; the download or copy was cut short?); re-download or re-save the model"
    )


def check_torch_archive(f: IO[bytes], source: str, trust_pickle: bool, *, max_expand: int = 100) -> None:
    """Refuse a torch zip archive that is damaged or would run code when loaded (see the module doc).

    ``f`` is the open file torch will read next (the same bytes are checked and loaded)."""
    check_zip_end(f, source)
    try:
        zf = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ModelLoadError(f"{source}: not a readable torch archive ({exc}); is the file complete? re-save it") from None
    with zf:
        infos = zf.infolist()
        f.seek(0, io.SEEK_END)
        packed = max(f.tell(), 1)
        expanded = sum(i.file_size for i in infos)
        if expanded > max_expand * packed and expanded > (256 << 20):
            raise ModelLoadError(
                f"{source}: its members expand to {expanded / 2**30:.1f} GiB from {packed / 2**20:.1f} MiB "
                "(torch stores weights uncompressed; this is a zip bomb or not a torch archive); refusing it"
            )
        try:
            bad_member = zf.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
            raise ModelLoadError(f"{source}: the archive is damaged ({exc}); re-save or re-download the model") from None
        if bad_member is not None:
            raise ModelLoadError(
                f"{source}: member {bad_member} fails its CRC check (the file was changed or damaged after saving); "
                "re-save or re-download the model"
            )
        names = [i.filename for i in infos]
        configs = list(_payload_configs(zf, names, source))
        _check_payload_sizes(zf, configs, source)
        if trust_pickle:
            return
        torchscript = any(n.split("/", 1)[-1].startswith("code/") for n in names)
        by_config = {member for member, _, meta in configs if meta.get("use_pickle")}
        for n in names:
            short = n.split("/", 1)[-1]
            leaf = n.rsplit("/", 1)[-1]
            if "/constants/" in f"/{n}" and leaf.startswith(("custom_obj", "opaque_obj")):
                raise ModelLoadError(
                    f"{source}: member {n} is a pickled Python object (a torchbind or opaque constant), which loading "
                    f"would unpickle with plain pickle; {TRUST_FIX}"
                )
            if short.startswith("models/") and n.endswith(".json"):
                _check_model_json(zf.read(n), source, n)
                continue
            data = None
            if n.endswith(".pkl") or "/sample_inputs/" in f"/{n}" or n in by_config or n.endswith((".pt", ".pth")):
                data = zf.read(n)
            if data is None:
                continue
            _check_pickled(data, source, n, torchscript)


def _check_model_json(raw: bytes, source: str, member: str) -> None:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ModelLoadError(f"{source}: member {member} is not valid JSON; the archive is damaged: re-export") from None
    guards = doc.get("guards_code", []) if isinstance(doc, dict) else []
    for code in guards if isinstance(guards, list) else [str(guards)]:
        if not isinstance(code, str) or not check_guard(code):
            raise ModelLoadError(
                f"{source}: member {member} holds a guard {str(code)[:60]!r} that is not a plain shape check "
                f"(torch.export pastes guards into Python and runs them); {TRUST_FIX}"
            )
    for expr in _sym_exprs(doc):
        if not check_sym_expr(expr):
            raise ModelLoadError(
                f"{source}: member {member} holds a shape expression {expr[:60]!r} that is not plain arithmetic "
                f"(torch would evaluate it with sympy.sympify, i.e. run it as Python); {TRUST_FIX}"
            )


def _check_pickled(data: bytes, source: str, member: str, torchscript: bool) -> None:
    """A member torch unpickles: a nested torch.save zip (scan its .pkl members) or a raw pickle."""
    if data[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as inner:
                if inner.testzip() is not None:
                    raise ModelLoadError(f"{source}: member {member} is damaged (CRC); re-save the model")
                for n in inner.namelist():
                    if n.endswith(".pkl"):
                        _check_pickled(inner.read(n), source, f"{member}:{n}", torchscript)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise ModelLoadError(f"{source}: member {member} is a damaged zip ({exc}); re-save the model") from None
        return
    try:
        globals_ = pickle_globals(data)
    except ValueError as exc:
        raise ModelLoadError(f"{source}: member {member} is not a readable pickle ({exc}); the archive is damaged: "
                             "re-save or re-download the model") from None
    bad = _unsafe(globals_, torchscript)
    if bad:
        raise ModelLoadError(
            f"{source}: member {member} imports {', '.join(bad[:3])} when unpickled, outside torch's weights-only "
            f"allowlist: loading it could run code from the file; {TRUST_FIX}"
        )


# ---------------------------------------------------------------- TensorFlow SavedModel

# TF ops that touch the file system (or run code registered by name) when the graph runs: a SavedModel's serving
# function has no business calling them. The checkpoint ops are allowed only in the saver's own functions.
_TF_FILE_OPS = {
    "WriteFile", "ReadFile", "MatchingFiles", "DeleteFile", "PyFunc", "PyFuncStateless", "EagerPyFunc",
    "ImmutableConst", "InitializeTableFromTextFile", "InitializeTableFromTextFileV2", "PrintV2",
    "CreateSummaryFileWriter", "WriteSummary", "WriteScalarSummary", "WriteRawProtoSummary", "WriteGraphSummary",
    "DatasetToTFRecord", "SaveDataset", "SaveDatasetV2", "ExperimentalDatasetToTFRecord", "TFRecordDataset",
    "TFRecordDatasetV2", "FixedLengthRecordDataset", "TextLineDataset", "LoadDataset", "DebugIdentityV2",
    "DebugIdentityV3",
}
_TF_CHECKPOINT_OPS = {"SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints", "RestoreV2", "Restore", "RestoreSlice",
                      "ShardedFilename", "ShardedFilespec"}
_SAVER_FUNCTION = re.compile(r"_traced_(save|restore)|^save_fn|^restore_fn|_save_fn|_restore_fn")


def check_saved_model(folder, source: str, trust_pickle: bool) -> None:
    """Refuse a SavedModel whose graph would read, write or delete files, or call Python, when it runs
    (``saved_model.pb`` is parsed with TensorFlow's own protobuf classes; nothing in it runs here)."""
    if trust_pickle:
        return
    from pathlib import Path

    from tensorflow.core.protobuf import saved_model_pb2

    pb = Path(folder) / "saved_model.pb"
    sm = saved_model_pb2.SavedModel()
    try:
        sm.ParseFromString(pb.read_bytes())
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and others
        raise ModelLoadError(f"{source}: TensorFlow cannot load the SavedModel (saved_model.pb does not parse: "
                             f"{type(exc).__name__}); is the folder complete? re-export it") from None
    bad: list[str] = []
    for mg in sm.meta_graphs:
        for node in mg.graph_def.node:
            if node.op in _TF_FILE_OPS:
                bad.append(f"{node.op} (graph node {node.name})")
        for fn in mg.graph_def.library.function:
            saver = bool(_SAVER_FUNCTION.search(fn.signature.name))
            for node in fn.node_def:
                if node.op in _TF_FILE_OPS or (node.op in _TF_CHECKPOINT_OPS and not saver):
                    bad.append(f"{node.op} (in {fn.signature.name})")
    if bad:
        raise ModelLoadError(
            f"{source}: the SavedModel's graph holds ops that read or write files or call Python when it runs: "
            f"{', '.join(sorted(set(bad))[:4])}; edgekit runs such graphs only with --trust-pickle (a SavedModel is "
            "code: trust it only from a source you trust)"
        )
