"""Every `require(module, extra)` names an extra that installs the module it requires.

The calls are read from the source (ast), the extras from pyproject.toml, and each extra's
closure from the installed distributions' metadata: a hint that says `pip install 'edgekit[x]'`
must be one that, run, makes the import work.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from edgekit import deps

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"edgekit": ROOT / "edgekit", "edgekit.converters": ROOT / "converters"}
# import names of distributions that may not be installed where the test runs
IMPORT_TO_DIST = {
    "sklearn": "scikit-learn", "torch_pruning": "torch-pruning", "ai_edge_litert": "ai-edge-litert",
    "ai_edge_quantizer": "ai-edge-quantizer", "litert_torch": "litert-torch", "brevitas": "brevitas",
    "qonnx": "qonnx", "hls4ml": "hls4ml", "coremltools": "coremltools", "onnxruntime": "onnxruntime",
    "onnxslim": "onnxslim", "onnxscript": "onnxscript", "onnx": "onnx", "scipy": "scipy", "ray": "ray",
    "matplotlib": "matplotlib", "tf2onnx": "tf2onnx", "tensorflow": "tensorflow", "keras": "keras",
    "flatbuffers": "flatbuffers", "paramiko": "paramiko", "adbutils": "adbutils",
}


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def installed_dists() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def dist_of(module: str) -> str:
    top = module.split(".")[0]
    installed = installed_dists().get(top)
    return canon(installed[0] if installed else IMPORT_TO_DIST[top])


@cache
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def closure(reqs: list[str] | tuple[str, ...]) -> set[str]:
    """Distributions that installing ``reqs`` brings, following edgekit[x] and installed metadata."""
    seen: set[str] = set()
    todo = list(reqs)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canon(req.name)
        if name == "edgekit":
            for extra in req.extras:
                todo.extend(pyproject()["optional-dependencies"][extra])
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(metadata.requires(name) or [])
        except metadata.PackageNotFoundError:
            pass  # not installed here: its own name is what the extra declares
    return seen


@cache
def installs(extra: str | None) -> set[str]:
    base = closure(pyproject()["dependencies"])
    return base if extra is None else base | closure(pyproject()["optional-dependencies"][extra])


def module_file(dotted: str) -> Path | None:
    for prefix, folder in sorted(SOURCES.items(), key=lambda kv: -len(kv[0])):
        if dotted == prefix or dotted.startswith(prefix + "."):
            rest = dotted[len(prefix):].lstrip(".").split(".") if dotted != prefix else []
            base = folder.joinpath(*rest)
            for f in (base.with_suffix(".py"), base / "__init__.py"):
                if f.exists():
                    return f
    return None


def constant(path: Path, name: str) -> str | None:
    """The string a module-level NAME holds in ``path``, following `from x import NAME`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name and (src := module_file(node.module)):
                    return constant(src, alias.name)
    return None


def require_calls() -> list[tuple[str, str, str | None]]:
    """(where, module, extra the hint names) for every require(...) call with a literal module."""
    calls = []
    for folder in SOURCES.values():
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require"):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                mod = node.args[0] if node.args else None
                assert isinstance(mod, ast.Constant) and isinstance(mod.value, str), f"{where}: module not a literal"
                arg = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "extra"), None)
                if arg is None or (isinstance(arg, ast.Constant) and arg.value is None):
                    extra = None
                elif isinstance(arg, ast.Constant):
                    extra = arg.value
                else:
                    assert isinstance(arg, ast.Name), f"{where}: extra is neither a literal nor a name"
                    extra = constant(path, arg.id)
                    assert extra is not None, f"{where}: cannot resolve {arg.id}"
                # require() falls back to the extra deps.KNOWN gives the top-level module
                extra = extra or deps.KNOWN.get(mod.value.split(".")[0], (None, None))[1]
                calls.append((where, mod.value, extra))
    return calls


def test_calls_are_found():
    calls = require_calls()
    assert len(calls) > 50
    assert {m for _, m, _ in calls} >= {"onnx", "matplotlib", "torch_pruning", "ray"}


def test_every_require_names_the_extra_that_installs_it():
    wrong = []
    for where, module, extra in require_calls():
        if module.split(".")[0] == "torch":
            continue  # never in an extra: the hint says to install PyTorch first
        if extra is not None and extra not in pyproject()["optional-dependencies"]:
            wrong.append(f"{where}: require({module!r}) names edgekit[{extra}], which pyproject.toml does not define")
            continue
        if dist_of(module) not in installs(extra):
            what = f"edgekit[{extra}]" if extra else "no extra (the core install)"
            wrong.append(f"{where}: require({module!r}) names {what}, which does not install {dist_of(module)}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module, extra", [("matplotlib", "plan"), ("onnx", "jetson"), ("paramiko", None)])
def test_closure_sanity(module, extra):
    assert dist_of(module) in installs(extra)
    assert dist_of("ray") not in installs(extra)


def test_the_cli_prints_the_extra(tmp_path):
    """The hint reaches the terminal whole: rich would take `[plan]` in `edgekit[plan]` for markup and drop it."""
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None\n"
        "import edgekit.cli as cli\n"
        "from edgekit.deps import require\n"
        "@cli.app.command('needs-matplotlib')\n"
        "def needs() -> None:\n"
        "    require('matplotlib', 'plan')\n"
        "sys.argv = ['edgekit', 'needs-matplotlib']\n"
        "cli.main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'edgekit[plan]'" in proc.stderr, proc.stderr


def test_keras_extra_names_one_tensorflow_distribution():
    """tf-keras requires `tensorflow`; the extra names it alone, on every platform (tensorflow-cpu beside it is a
    second copy of the same `tensorflow/` folder)."""
    reqs = [Requirement(r) for r in pyproject()["optional-dependencies"]["keras"]]
    tf = [r for r in reqs if canon(r.name) in deps.TF_DISTS]
    assert [canon(r.name) for r in tf] == ["tensorflow"] and tf[0].marker is None, [str(r) for r in tf]


@pytest.mark.parametrize("installed, dist", [({"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"}, "tensorflow"),
                                             ({"tensorflow-cpu": "2.21.1"}, "tensorflow-cpu"),
                                             ({"tensorflow": "2.21.0"}, "tensorflow"), ({}, None)])
def test_tensorflow_version_under_either_distribution(monkeypatch, installed, dist):
    monkeypatch.setattr(deps, "version", installed.get)
    assert deps.tensorflow_dist() == dist
    assert deps.tensorflow_version() == installed.get(dist)
