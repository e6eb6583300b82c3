"""One contract, every registered converter: the same small real model (the digits MLP, trained on
scikit-learn's digits) through each target named in ``edgekit.converters.CONVERTERS``.

A new converter gets these checks by registering: artifact written where the manifest says, its host
runner runs and matches the float model on a golden sample, the manifest is the one typed schema,
the registry and the target profile agree, and an unknown or bad ``--option`` is refused before any
work. Each target's own suite (test_android, test_ios, test_fpga, test_foundation_jetson) checks
what only that toolchain does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgekit.converters import CONVERTERS, converter_info
from edgekit.errors import ConversionError
from edgekit.manifest import Manifest
from edgekit.profiles import list_targets

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "digits_fpga" / "digits_mlp.pt2"
CALIB = ROOT / "examples" / "digits" / "calib.npz"
# each target at the precision its own suite does not build from this model, cheapest first
PRECISION = {"jetson": "fp16", "android": "fp32", "ios": "fp16", "fpga": "int8"}
TARGETS = {t.name: t for t in list_targets()}
HOST_RUNTIME = {"jetson": "onnxruntime", "android": "ai_edge_litert", "ios": "coremltools", "fpga": "hls4ml"}


def test_every_registered_converter_has_a_target_and_a_contract_case():
    used = {t.converter for t in TARGETS.values()}
    assert used == set(CONVERTERS), "a registered converter without a target (or the reverse)"
    assert set(PRECISION) == set(TARGETS), "a target without a contract case: add it to PRECISION"


@pytest.fixture(scope="module", params=sorted(TARGETS))
def built(request, tmp_path_factory):
    from edgekit.pipeline import convert

    name = request.param
    pytest.importorskip(HOST_RUNTIME[name])
    out = tmp_path_factory.mktemp("contract") / name
    res = convert(MLP, target=name, precision=PRECISION[name], calib=str(CALIB), out=out, golden_count=4)
    return name, res


def test_artifact_manifest_and_runner(built):
    name, res = built
    tgt = TARGETS[name]
    man = Manifest.model_validate(res.manifest)  # the one schema
    assert man.target == name and man.precision == PRECISION[name] and man.verification_passed
    primary = res.out_dir / man.artifact["primary"]
    assert primary.exists(), f"{name}: the artifact the manifest names is not there"
    for rel, info in man.files.items():
        assert (res.out_dir / rel).stat().st_size == info.bytes
    assert man.runner.entry in man.files and (res.out_dir / man.runner.entry).is_file()
    assert man.format == tgt.format and PRECISION[name] in converter_info(tgt.converter).precisions
    # the converter's host runner ran the written artifact against the float model on the golden samples
    v = res.verification
    assert v.runtime and v.golden_samples == 4 and v.outputs and all(o.passed for o in v.outputs)
    with np.load(res.out_dir / man.golden.file) as z:
        assert {g.key for g in man.golden.inputs + man.golden.outputs} <= set(z.files)
        assert z[man.golden.inputs[0].key].shape[0] == 4


@pytest.mark.parametrize("name", sorted(CONVERTERS))
def test_unknown_and_bad_options_are_refused_before_work(name, tmp_path):
    from edgekit.pipeline import convert

    tgt = next(t for t in TARGETS.values() if t.converter == name)
    with pytest.raises(ConversionError, match="no_such_key: not an option of converter.*it takes: .*allow_float_fallback"):
        convert(MLP, target=tgt.name, out=tmp_path / "o", precision=tgt.precisions[0], calib=str(CALIB),
                options={"no_such_key": 1})
    with pytest.raises(ConversionError, match="allow_float_fallback=maybe"):
        convert(MLP, target=tgt.name, out=tmp_path / "o", precision=tgt.precisions[0], calib=str(CALIB),
                options={"allow_float_fallback": "maybe"})
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", sorted(CONVERTERS))
def test_each_declared_mixed_precision_capability_is_implemented(name):
    """What the registry declares a converter offers mixed precision (ConverterInfo.mixed) is what the pipeline's
    mixed stage calls: the converter implements every method of each declared capability's protocol."""
    import importlib

    from edgekit.converters.capabilities import PROTOCOLS, methods

    info = converter_info(name)
    assert info.mixed <= set(PROTOCOLS), f"{name}: unknown capabilities {sorted(info.mixed - set(PROTOCOLS))}"
    conv = importlib.import_module(info.module).CONVERTER
    for capability in sorted(info.mixed):
        for method in methods(capability):
            assert callable(getattr(type(conv), method, None)), f"{name} declares {capability!r} but has no {method}"
    if info.speed:  # the speed stage calls it (edgekit.speed)
        assert callable(getattr(type(conv), "host_speed", None)), f"{name} declares speed but has no host_speed"
    assert callable(getattr(type(conv), "versions", None)), f"{name}: no versions() (the Converter protocol)"


def test_no_capability_is_found_by_hasattr():
    """Capabilities are declared in the registry, never probed on the converter object."""
    import re

    probe = re.compile(r"hasattr\(\s*(conv|converter)\b")
    files = [p for folder in ("edgekit", "converters") for p in sorted((ROOT / folder).rglob("*.py"))]
    found = [f"{p.relative_to(ROOT)}:{i}" for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if probe.search(line)]
    assert not found, f"hasattr probes of a converter: {found}"
