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
