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


def _pickled_by_config(zf: zipfile.ZipFile, names: list[str]) -> set[str]:
    """Members that a .pt2's weights/constants configs mark ``use_pickle`` (torch.load(weights_only=False))."""
    out = set()
    for n in names:
        if not n.endswith("_config.json") or "/data/" not in f"/{n}":
            continue
        try:
            cfg = json.loads(zf.read(n))
        except ValueError:
            raise ModelLoadError(f"member {n} is not valid JSON; the archive is damaged: re-export the model") from None
        base = n.rsplit("/", 1)[0]
        entries = cfg.get("config", {}) if isinstance(cfg, dict) else {}
        for meta in entries.values() if isinstance(entries, dict) else []:
            if isinstance(meta, dict) and meta.get("use_pickle"):
                out.add(f"{base}/{meta.get('path_name', '')}")
    return out


def check_torch_archive(f: IO[bytes], source: str, trust_pickle: bool, *, max_expand: int = 100) -> None:
    """Refuse a torch zip archive that is damaged or would run code when loaded (see the module doc).

    ``f`` is the open file torch will read next (the same bytes are checked and loaded)."""
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
        if trust_pickle:
            return
        names = [i.filename for i in infos]
        torchscript = any(n.split("/", 1)[-1].startswith("code/") for n in names)
        by_config = _pickled_by_config(zf, names)
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
