"""The shape of the house: no import circles between rooms, a pipeline that only orchestrates.

The import graph is read from the source with ``ast`` (module-level *and* function-level imports;
``if TYPE_CHECKING:`` imports never run and are left out). The one circle allowed is the transport
registry (``transports.base`` opens the transport a host address names, and each transport
subclasses ``base``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {frozenset({"edgekit.transports.base", "edgekit.transports.local", "edgekit.transports.ssh",
                      "edgekit.transports.adb"})}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in (("edgekit", "edgekit"), ("converters", "edgekit.converters")):
        for p in (ROOT / folder).rglob("*.py"):
            parts = [x for x in p.relative_to(ROOT / folder).with_suffix("").parts if x != "__init__"]
            mods[".".join([pkg, *parts])] = p
    return mods


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for b in node.body for n in ast.walk(b))
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[m] |= {n for n in names if n in mods and n != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_between_rooms():
    found = [c for c in cycles(import_graph()) if frozenset(c) not in ALLOWED]
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_the_graph_sees_a_circle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [{"a", "b", "c"}]


def test_core_imports_no_converter_and_the_cli_modules_not_their_entry():
    g = import_graph()
    for m in ("edgekit.analyze", "edgekit.ingest", "edgekit.verify", "edgekit.stages", "edgekit.pipeline"):
        assert not {d for d in g[m] if d.startswith("edgekit.converters.")}, m  # the registry only, no converter
    for m in ("edgekit.cli.convert", "edgekit.cli.flash", "edgekit.cli.matrix", "edgekit.cli.plan", "edgekit.cli.profiles"):
        assert "edgekit.cli" not in g[m], m


def test_pipeline_only_orchestrates():
    """pipeline.convert calls the stages in the declared order; the work is in edgekit.stages."""
    from edgekit import pipeline, stages

    src = (ROOT / "edgekit" / "pipeline.py").read_text()
    nodes = sorted((n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    calls = [n.func.attr for n in nodes  # in the order they are written (ast.walk is breadth-first)
             if isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "stages"
             and n.func.attr in stages.STAGE_NAMES]
    assert calls == list(pipeline.ORDER) == list(stages.STAGE_NAMES)
    stages.check_order(pipeline.ORDER)
    import pytest

    with pytest.raises(ValueError, match="stage 'convert' needs"):
        stages.check_order(["ingest", "convert"])


def test_every_package_is_installed():
    """A package missing from pyproject's list works in an editable install and is left out of a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {m for m, p in _modules().items() if p.name == "__init__.py"}
    assert found - listed == set(), "packages missing from pyproject.toml [tool.setuptools] packages"


MAX_LINES = 600  # one idea per module; past this a file is usually several


def test_no_python_file_is_over_the_line_limit():
    roots = ("edgekit", "converters", "firmware", "zoo", "bench", "tests", "examples")
    long = {str(p.relative_to(ROOT)): n for r in roots for p in (ROOT / r).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def _converter_of(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) > 2 and parts[:2] == ["edgekit", "converters"] and parts[2] not in ("common", "job", "options",
                                                                                        "capabilities"):
        return parts[2]
    return None


def test_no_converter_imports_another_converter_or_the_trainer():
    """What two converters share lives in edgekit.converters.common, below them; a converter reads a fine-tuned
    model's record through edgekit.lineage, never through the trainer."""
    bad = []
    for m, deps in import_graph().items():
        own = _converter_of(m)
        if own is None:
            continue
        bad += [(m, d) for d in deps if (_converter_of(d) or own) != own or d.startswith("edgekit.finetune")]
    assert not bad, bad


FRAMEWORKS = {"torch", "torchvision", "tensorflow", "keras", "tf_keras", "onnx", "onnxruntime", "onnxslim",
              "coremltools", "hls4ml", "brevitas", "qonnx", "litert_torch", "ai_edge_litert", "ai_edge_quantizer",
              "tensorrt", "sklearn", "scipy", "matplotlib"}


def test_the_core_imports_no_framework_at_module_level():
    """DESIGN.md: frameworks are imported inside the functions that need them, never at the top of a core module
    (``edgekit --help`` would pay for them). Read from the source: module-level imports outside TYPE_CHECKING."""
    bad = []
    for p in (ROOT / "edgekit").rglob("*.py"):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            bad += [f"{p.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FRAMEWORKS]
    assert not bad, bad
