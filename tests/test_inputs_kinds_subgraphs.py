"""Inputs and outputs as real models have them: weights inside If branches are counted, a per-position
softmax ([N, T, classes], a CTC recogniser) is a class decision per position."""

from __future__ import annotations

import numpy as np


def test_analysis_counts_weights_used_inside_if_branches(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgekit.analyze import analyze_onnx

    rng = np.random.default_rng(0)
    w_a = numpy_helper.from_array(rng.standard_normal((64, 600)).astype(np.float32), "w_a")  # outer weights, used
    w_b = numpy_helper.from_array(rng.standard_normal((64, 600)).astype(np.float32), "w_b")  # only in the branches
    inner = numpy_helper.from_array(rng.standard_normal((600,)).astype(np.float32), "inner_bias")
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w_a"], ["t"]),
                                helper.make_node("Add", ["t", "inner_bias"], ["y_then"])], "then", [],
                               [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [1, 600])],
                               initializer=[inner])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "w_b"], ["y_else"])], "else", [],
                               [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [1, 600])])
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 600])], initializer=[w_a, w_b])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, tmp_path / "if.onnx")
    stats = analyze_onnx(tmp_path / "if.onnx", supported_ops=["If", "MatMul"])
    assert stats.weight_params == 2 * 64 * 600 and stats.other_params == 600, stats
    assert stats.ops == {"If": 1, "MatMul": 2, "Add": 1}
    assert [u["op"] for u in stats.unsupported] == ["Add"]  # an op inside a branch is checked too


def test_per_position_softmax_is_a_class_per_position():
    from edgekit.verify import output_checks

    smoke = output_checks()
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 40, 100)) * 4
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert smoke.infer_kind(probs, 1) == "class"
    assert smoke.infer_kind(logits, 1) == "regression"  # not probabilities: no decision to read
    tol = {"max_rel_error": 0.5, "min_top1_agreement": 0.99, "abs_floor": 0.0}
    flipped = probs.copy()
    t = 3  # one position of one sample takes its second choice: 1 of 320 decisions changes
    order = np.argsort(-flipped[0, t])
    flipped[0, t, order[0]], flipped[0, t, order[1]] = flipped[0, t, order[1]], flipped[0, t, order[0]]
    c = smoke.check_output("probs", "class", probs, flipped, tol)
    assert c["positions"] == 320 and c["top1_agreement"] == 319 / 320
    assert c["passed"]  # 99.7% of the per-position decisions agree


def test_zoo_text_inputs_are_integer_token_ids(tmp_path):
    """The MiniLM zoo model's inputs: real sentences (Python's own docstrings, the Zen of Python), BERT's uncased
    WordPiece over a vocab.txt, [CLS] ... [SEP] padded with 0, int64 ids and mask."""
    from edgekit.zoo import data as zdata

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "simple", "is", "better", "than", "complex", ".", "un", "##able",
             "##s", "cafe"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    v = {t: i for i, t in enumerate(vocab)}
    assert zdata._wordpiece("Simple is better than complex.", v) == [4, 5, 6, 7, 8, 9]
    assert zdata._wordpiece("Unables CAFÉ zzz", v) == [10, 11, 12, 13, 1]  # pieces, accents stripped, [UNK]
    sents = zdata.sentences(40)
    assert len(sents) == 40 and "Simple is better than complex." in zdata.sentences()
    toks = zdata.minilm_tokens(tmp_path / "vocab.txt", n=8, seq=12)
    ids, mask = toks["input_ids"], toks["attention_mask"]
    assert ids.dtype == mask.dtype == np.int64 and ids.shape == (8, 12)
    assert (ids[:, 0] == 2).all() and all(ids[i, mask[i].sum() - 1] == 3 for i in range(8))
    assert ((ids == 0) == (mask == 0)).all()


def test_zoo_text_line_inputs_hold_one_line_each():
    """An OCR recogniser reads one line: in each of the zoo's text-line inputs one band of rows (gaps of at most 2
    rows inside it) holds at least 90% of the ink (a neighbour line's descender may show at the edge). The first recipe cut bands of 3-4 lines out of the unevenly lit scan,
    and PP-OCR read nothing in them (every step blank), so its INT8 'agreement' was over blanks."""
    from edgekit.zoo import data as zdata

    x = zdata._text_lines(48, 320, 24)
    assert x.shape == (24, 48, 320) and 0 <= x.min() and x.max() <= 255
    for img in x:
        ink = (img < img.mean() - 1.5 * img.std()).sum(axis=1)
        rows = np.flatnonzero(ink > 0.01 * img.shape[1])
        assert rows.size >= 8, "no text in a line input"
        bands = np.split(rows, np.flatnonzero(np.diff(rows) > 3) + 1)
        assert max(ink[b].sum() for b in bands) >= 0.9 * ink.sum(), f"more than one line of text: ink rows {rows}"
    pages = zdata.text_pages_imagenet(64, 64, 8)
    assert pages.shape == (8, 3, 64, 64) and pages.dtype == np.float32


def test_zoo_captcha_inputs_are_photographs_with_characters():
    """ddddocr's detector finds characters on click captchas: on bare photographs its best anchor scored a median
    0.07 and its INT8 verdict was about score noise around the 0.25 threshold. Its inputs are photographs with 3-6
    characters drawn on them, every fourth one left bare (a captcha's background alone)."""
    from edgekit.zoo import data as zdata

    x = zdata.captcha_rgb_255(96, 96, 8)
    bare = zdata._crops(96, 96, 8, seed=1).transpose(0, 3, 1, 2)
    assert x.shape == (8, 3, 96, 96) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 255
    changed = np.abs(x - np.clip(bare, 0, 255).astype(np.uint8)).max(axis=(1, 2, 3)) > 0
    assert list(changed) == [i % 4 != 3 for i in range(8)]
    assert np.array_equal(zdata.captcha_rgb_255(96, 96, 8), x)  # seeded: the same inputs on every run


def test_zoo_face_inputs_are_distinct_faces():
    """fer's expression model was fed crops of scikit-image's photographs (coffee, a rocket, the moon): no face,
    so its decisions were near-guesses and INT8 agreed with float on 93.1% of them. Its inputs are LFW's face
    crops now, then mirrored and slightly cropped copies: no image twice, fer's [-1, 1] scale, seeded."""
    from skimage import data

    from edgekit.zoo import data as zdata

    x = zdata.faces_gray_pm1(64, 64, 130)
    assert x.shape == (130, 64, 64, 1) and x.dtype == np.float32 and -1 <= x.min() and x.max() <= 1
    flat = x.reshape(len(x), -1)
    assert len(np.unique(flat.round(4), axis=0)) == len(x), "an input repeats"
    first = zdata._resize(np.asarray(data.lfw_subset()[0], np.float32), 64, 64)
    np.testing.assert_allclose(x[0, ..., 0], (np.clip(first, 0, 1) - 0.5) * 2, atol=1e-6)  # the faces come first
    assert np.array_equal(zdata.faces_gray_pm1(64, 64, 130), x)


def test_zoo_sentences_do_not_depend_on_what_the_process_imported():
    """The sentence pool is the docstrings of stdlib modules and their attributes; a module's dir() also lists the
    submodules anything else imported (pytest imports logging.handlers): the pool, and every input drawn after it,
    came out different inside the test run than in `edgekit zoo run`. It is made in an isolated interpreter now."""
    import importlib

    from edgekit.zoo import data as zdata

    zdata._sentence_pool.cache_clear()
    before = zdata.sentences(400)
    for name in ("logging.handlers", "logging.config", "json.tool", "concurrent.futures", "http.server"):
        importlib.import_module(name)
    zdata._sentence_pool.cache_clear()
    assert zdata.sentences(400) == before and len(set(before)) == 400


def test_zoo_inputs_built_by_two_runs_at_once(tmp_path, monkeypatch):
    """Two runs building the same zoo model's inputs at once (two bench scripts side by side) each write a file of
    their own and rename it into place. With one shared ".part" name, the second rename found its file already
    renamed away by the first (FileNotFoundError). Both writes are held at a barrier here, so the old race is
    certain, not a matter of timing."""
    import threading

    from edgekit.zoo import run as zrun
    from edgekit.zoo import select

    monkeypatch.setenv("EDGEKIT_ZOO_CACHE", str(tmp_path))
    monkeypatch.setattr(zrun.zdata, "build", lambda recipe, cache, files: np.arange(12, dtype=np.float32).reshape(4, 3))
    monkeypatch.setattr(zrun, "other_files", lambda m, log=None: {})
    both_written = threading.Barrier(2, timeout=30)
    savez = np.savez

    def savez_then_wait(file, **arrays):
        savez(file, **arrays)
        both_written.wait()

    monkeypatch.setattr(zrun.np, "savez", savez_then_wait)
    m = select(["ppocr-cls"])[0]
    got, errors = [], []

    def build() -> None:
        try:
            got.append(zrun.prepare_data(m))
        except Exception as exc:  # noqa: BLE001 - the test reports whatever the run raised
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(got) == 2 and got[0] == got[1], errors
    with np.load(got[0]) as z:
        assert z["x"].tolist() == np.arange(12, dtype=np.float32).reshape(4, 3).tolist()
    assert [p.name for p in got[0].parent.iterdir()] == [got[0].name]  # no partial file left
