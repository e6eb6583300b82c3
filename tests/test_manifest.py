"""The one typed manifest: written by the pipeline, read by bundle/flash/smoke, its schema printed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgekit.manifest import Manifest, schema
from edgekit.pipeline import bundle_name


def test_schema_forbids_unknown_fields_and_is_printed():
    s = schema()
    assert s["additionalProperties"] is False and "schema_version" in s["properties"]
    proc = subprocess.run([sys.executable, "-m", "edgekit", "manifest-schema"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["properties"]["files"]["minProperties"] == 1


@pytest.mark.parametrize("source, want", [
    ("examples/digits/digits_cnn.pt2", "digits_cnn-jetson-int8"),
    ("/data/my model (1).pt2", "my_model_1-jetson-int8"),
    ("pkg.nets:resnet", "resnet-jetson-int8"),
    ("../../..pt2", "model-jetson-int8"),
])
def test_bundle_name_is_one_plain_folder_name(source, want):
    import re

    from edgekit.manifest import SAFE_NAME

    name = bundle_name(source, "jetson", "int8")
    assert name == want and re.match(SAFE_NAME, name)  # the pattern the manifest enforces


def test_written_manifest_is_the_model(tmp_path):
    from flash_support import digits_build

    raw = json.loads((digits_build() / "manifest.json").read_text())
    man = Manifest.model_validate(raw)
    assert man.schema_version == 2 and man.verification_passed and man.runner.entry in man.files
    assert man.to_json() == raw


def test_golden_samples_represent_the_data_and_never_calibrate(tmp_path):
    """Golden samples are drawn across the file (stratified by label), recorded in the manifest, and held out
    of calibration when both come from one file; an eval file that is the calibration file is split."""
    import numpy as np

    from edgekit.pipeline import convert

    root = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "digits"
    with np.load(root / "eval.npz") as z:
        x, y = z["image"] if "image" in z.files else z[z.files[0]], z["label"]
    order = np.argsort(y, kind="stable")  # sorted by class: the first 64 samples are all class 0..1
    both = tmp_path / "sorted.npz"
    np.savez(both, image=x[order], label=y[order])
    res = convert(root / "digits_cnn.pt2", "jetson", tmp_path / "b", board="host", precision="int8",
                  calib=str(both), eval_data=str(both))
    g = res.manifest["golden"]
    sel = g["selection"]
    assert g["samples"] == 64 and sel["stratified"] and sel["seed"] == 0
    with np.load(res.out_dir / "golden.npz") as z:
        golden_x = z["input_0"]
    sorted_y = y[order]
    # every class is in the golden set, although the file's first 64 samples hold two classes only
    held = np.sort(np.concatenate([np.flatnonzero((x[order] == gx).all(axis=(1, 2, 3)))[:1] for gx in golden_x]))
    assert len(set(sorted_y[held])) == 10 and len(set(sorted_y[:64])) <= 2
    # one file for calibration and eval: the held-out eval samples never calibrate
    assert sel["held_out_of_calibration"] >= len(y) // 4
    assert res.manifest["calibration"]["samples"] == len(y) - sel["held_out_of_calibration"]
    assert res.verification.eval_samples == sel["held_out_of_calibration"]


def test_default_output_folder_is_named_after_model_target_precision(digits, tmp_path, monkeypatch):
    """Without -o, builds go to build/<model>-<target>-<precision> (the precision as planned): two builds of one
    model never collide, and an earlier build is never in the way."""
    from edgekit.pipeline import convert

    monkeypatch.chdir(tmp_path)
    a = convert(digits["model"], "jetson", board="host", precision="fp32")
    b = convert(digits["model"], "jetson", board="host", precision="fp16")
    assert a.out_dir == tmp_path / "build" / "digits_cnn-jetson-fp32"
    assert b.out_dir == tmp_path / "build" / "digits_cnn-jetson-fp16" and (a.out_dir / "manifest.json").exists()
    c = convert(digits["model"], "jetson", board="host")  # auto: the planner's choice names the folder
    assert c.out_dir.name == f"digits_cnn-jetson-{c.manifest['precision']}"


def test_the_suite_writes_under_pytest_basetemp_only(tmp_path_factory):
    import tempfile

    from edgekit.fsutil import data_root

    base = tmp_path_factory.getbasetemp()
    assert data_root().is_relative_to(base) and __import__("pathlib").Path(tempfile.gettempdir()).is_relative_to(base)
