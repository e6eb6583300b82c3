"""The smoke-test core every edgekit device runner shares (integrity, golden, latency, result).

Copied into every bundle next to the target's runner (run.py / smoke.py), which keeps only
what is specific to its runtime. Needs only numpy; kept to Python 3.6 syntax (JetPack 4.6).
The result file, smoke_result.json, has one schema for every target: `checks` (name,
passed: true/false/null for "not judged", detail), `latency_ms`, `peak_rss_mb`, `power_w`,
`passed`.
"""

import hashlib
import json
import os
import platform
import sys
import time

import numpy as np


def log(msg):
    print("[edgekit-smoke] " + msg)
    sys.stdout.flush()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_integrity(bundle, manifest):
    bad = []
    for rel, info in sorted(manifest.get("files", {}).items()):
        path = os.path.join(bundle, rel)
        if not os.path.isfile(path):
            bad.append("%s: missing" % rel)
        elif sha256_file(path) != info["sha256"]:
            bad.append("%s: sha256 differs from the manifest" % rel)
    return bad


def fmt_mb(v):
    """MB as edgekit prints them (edgekit.units.fmt_mb from 1 MB up): one decimal at most, thousands separated."""
    s = format(v, ",.1f")  # no str.removesuffix: a board's Python may be 3.6
    return s[:-2] if s[-2:] == ".0" else s


def peak_rss_mb():
    # /proc VmHWM belongs to this process image; ru_maxrss survives exec and would report the
    # parent's peak when run from a big process (a test runner, an IDE, ssh's shell)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / 1024.0 if sys.platform != "darwin" else kb / (1024.0 * 1024.0)
    except Exception:
        return None


KINDS = ("class", "regression", "mask", "index", "detection", "detection_cf", "ctc")
# ``detection``: a YOLO-style head [N, anchors, 4 box + objectness (+ class scores)]; an anchor is a detection where
# objectness x its best class score reaches DET_SCORE (the usual confidence threshold of YOLO deployments).
# ``detection_cf``: the anchor-free head of YOLOv8 / YOLO11 (Ultralytics' export) [N, 4 box + C class scores,
# anchors]: channels first and no objectness; judged as ``detection`` with the anchors last and objectness 1
DET_SCORE = 0.25


def anchors_last(a):
    """A ``detection_cf`` output [N, 4 + C, anchors] as a ``detection`` one [N, anchors, 4 + 1 + C]: moved to
    anchors last, with an objectness of 1 (an anchor's score is then its best class score)."""
    a = np.swapaxes(np.asarray(a), 1, 2)
    return np.concatenate([a[..., :4], np.ones(a.shape[:-1] + (1,), a.dtype), a[..., 4:]], axis=-1)


# ``ctc``: a CTC recogniser's [N, T, classes] (probabilities or logits) judged as the text it decodes to: greedy
# decoding (arg-max per step, repeats merged, blank = class 0, PaddleOCR's, ddddocr's and torch's CTC default)


def _ctc_decode(steps):
    """One sample's [T, classes] -> (the decoded class indices, the line's confidence: the mean probability of
    the steps that emitted them, as PaddleOCR/RapidOCR score a line; 1.0 for an empty line)."""
    p = np.asarray(steps, dtype=np.float64)
    if p.size == 0:  # no time steps: no text
        return (), 1.0
    if not _probabilities(p):  # logits: softmax first
        p = np.exp(p - p.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
    best = np.argmax(p, axis=-1)
    keep = (best != 0) & np.append(True, best[1:] != best[:-1])
    conf = p[np.arange(len(best)), best][keep]
    return tuple(int(c) for c in best[keep]), float(conf.mean()) if conf.size else 1.0


def _edits(a, b):
    """Levenshtein distance between two sequences (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def _detected(a):
    score = a[..., 4] * a[..., 5:].max(axis=-1) if a.shape[-1] > 5 else a[..., 4]
    return score >= DET_SCORE


def _probabilities(ref):
    return ref.min() >= 0 and ref.max() <= 1 and np.allclose(ref.sum(axis=1), 1.0, atol=1e-3)


def infer_kind(ref, n_outputs):
    """An output's kind from its float values: integers are ``index``; [N, C>1] is ``class`` when it is the
    model's only output or holds probabilities (a softmax at the end), else ``regression`` (box, landmarks);
    [N, 1, H, W] in [0, 1] is a ``mask``; [N, ..., C] with probabilities over its last axis is a ``class`` per
    position; everything else ``regression``. ``--output-kind`` overrides."""
    ref = np.asarray(ref)
    if ref.dtype.kind in "iub":
        return "index"
    if ref.ndim == 2 and ref.shape[1] > 1:
        return "class" if n_outputs == 1 or _probabilities(ref) else "regression"
    if ref.ndim == 4 and ref.shape[1] == 1 and ref.size and ref.min() >= 0 and ref.max() <= 1:
        return "mask"
    if _per_position(ref):
        return "class"
    return "regression"


def _per_position(ref):
    """[N, ..., C>1] whose last axis holds probabilities: one class decision per position (a CTC recogniser's
    [N, T, classes] softmax, a per-token classifier), judged per position, not as one flattened arg-max."""
    return ref.ndim >= 3 and ref.shape[-1] > 1 and ref.size > 0 and bool(_probabilities(ref.reshape(-1, ref.shape[-1])))


def check_output(name, kind, ref, got, tol, label=""):
    """One output of the converted model against the float model, judged by its kind's metric.

    Every kind: no NaN/Inf, and max |error| is reported with its worst golden sample. For ``class`` and
    ``regression`` outputs it is held to max(max_rel_error x output range, abs_floor) (an absolute floor, so a
    tiny-range output is not failed on noise): where the kind's task metric is set (``class``: min_top1_agreement;
    ``regression``: min_snr_db) and passes, a max error over that bound is a warning (``warnings``, naming the
    sample), not a failure, unless the tolerance sets max_error_decides; without such a metric, or where it fails,
    it fails the output. ``mask`` and ``index`` outputs are judged by their decisions. ``class``: top-1 (and top-5)
    agreement, a flipped near-tie (float's own top-2 margin under 1% of the range) counted as agreeing;
    ``regression``: SNR in dB (min_snr_db where the profile sets it) and cosine similarity; ``mask``: IoU at
    0.5 (min_iou); ``index``: exact match (min_exact); ``detection`` ([N, anchors, 4 box + objectness (+ classes)]):
    IoU of the detected anchors (score >= DET_SCORE, min_iou) and SNR of their boxes (min_snr_db); ``ctc`` ([N, T,
    classes]): the greedy-decoded text matches on min_top1_agreement of the samples, and each line's confidence
    (mean probability of its characters) within max_rel_error. The host (edgekit.verify) and the board use this one
    function. Returns a dict: metrics, worst_sample, passed, failures, warnings, and decided_by (the checks whose
    bars decide this output's verdict, e.g. ["top1_agreement"] or ["snr_db", "max_rel_error"])."""
    at = (" at %s" % label) if label else ""
    ref64 = np.asarray(ref, dtype=np.float64)
    got64 = np.asarray(got, dtype=np.float64).reshape(ref64.shape)
    shown, head = kind, "[N, anchors, 4 box + objectness (+ classes)]"
    if kind == "detection_cf":  # judged as ``detection`` once the anchors are last (with objectness 1)
        head = "[N, 4 box + classes, anchors]"
        ok = ref64.ndim == 3 and ref64.shape[1] >= 5
        ref64, got64, kind = (anchors_last(ref64), anchors_last(got64), "detection") if ok else (
            ref64.reshape(-1), got64.reshape(-1), "detection")  # not 3-D: refused by the shape check below
    n = len(ref64)
    bad = int(np.count_nonzero(~np.isfinite(got64))) + int(np.count_nonzero(~np.isfinite(ref64)))
    diff = np.abs(got64 - ref64)
    err = float(np.max(diff)) if ref64.size else 0.0
    scale = float(np.max(np.abs(ref64))) if ref64.size else 0.0
    rel = err / scale if scale > 0 else err
    floor = float(tol.get("abs_floor") or 0.0)
    allowed = max(tol["max_rel_error"] * scale, floor)
    per_sample = diff.reshape(n, -1).max(axis=1) if n and ref64.size else np.zeros(0)
    out = {"output": name, "kind": shown, "max_abs_error": err, "max_abs_reference": scale, "max_rel_error": rel,
           "tolerance_rel": tol["max_rel_error"], "abs_floor": floor, "top1_agreement": None,
           "worst_sample": int(np.argmax(per_sample)) if per_sample.size and not bad else None, "samples": n}
    failures = []
    if bad:
        ref_bad = int(np.count_nonzero(~np.isfinite(ref64)))
        where = "the float model's outputs" if ref_bad else "the converted outputs (the float model's are finite%s)" % (
            ": an fp16 overflow? try fp32" if "fp16" in label else "")
        failures.append("output %r: %d non-finite value(s) (NaN/Inf) in %s on the golden inputs" % (name, bad, where))
    # a mask with no positive in either output (a wake-word score on speech without the word) has no decision to
    # compare: its values are judged instead, so an IoU of 1 over nothing never passes a build on its own
    empty_mask = kind == "mask" and not bad and not np.any((ref64 >= 0.5) | (got64 >= 0.5))
    if kind == "detection" and not bad:
        if ref64.ndim != 3 or ref64.shape[-1] < 5:
            failures.append("output %r: shape %s is not a detection head %s (give it another --output-kind)" % (
                name, list(np.shape(ref)), head))
            bad = -1  # no metric below for it (they all run on ``not bad``); its failure is the line above
        else:
            empty_mask = not np.any(_detected(ref64) | _detected(got64))  # nothing detected: judged by its values
    if kind == "ctc" and not bad and ref64.ndim != 3:
        failures.append("output %r: shape %s is not a CTC output [N, time steps, classes] (give it another "
                        "--output-kind)" % (name, list(ref64.shape)))
        bad = -1
    over = None  # the max-error line, where max error is over its bound
    if not bad and not err <= allowed and (kind in ("class", "regression") or empty_mask):
        # a mask or index output is judged by its decision (IoU at 0.5, exact match), not its largest pixel error:
        # one boundary pixel of a probability map moving from 0.45 to 0.55 is not a broken build
        over = "output %r: max error %.4g is %.2f%% of the output range %.4g (tolerance %.2f%%%s%s), golden sample %s" % (
            name, err, 100 * rel, scale, 100 * tol["max_rel_error"], (", floor %.3g" % floor) if floor else "", at,
            out["worst_sample"])
    at_over = len(failures)  # where the max-error line goes, if it fails the output
    task = None  # the kind's task metric the tolerance sets for class / regression outputs: it decides their verdict
    if kind == "class" and ref64.ndim >= 2 and not bad:
        per_pos = _per_position(ref64)  # [N, T, C]: a decision per position
        r2 = ref64.reshape(-1, ref64.shape[-1]) if per_pos else ref64.reshape(n, -1)
        g2 = got64.reshape(r2.shape)
        top_ref = np.argmax(r2, axis=1)
        agree = float(np.mean(np.argmax(g2, axis=1) == top_ref))
        out["positions"] = len(r2)
        out["top1_agreement"] = agree
        out["min_top1_agreement"] = tol["min_top1_agreement"]
        if r2.shape[1] >= 5:
            top5 = np.argsort(-g2, axis=1)[:, :5]
            out["top5_agreement"] = float(np.mean([t in row for t, row in zip(top_ref, top5)]))
        flips = np.argmax(g2, axis=1) != top_ref
        top2 = np.sort(r2, axis=1)[:, -2:] if r2.shape[1] > 1 else np.zeros((len(r2), 2))
        # a near-tie: float's own top-2 margin under 1% of the output range, a decision any rounding may move
        near = flips & ((top2[:, 1] - top2[:, 0]) < 0.01 * scale)
        out["disagreements"], out["near_tie_disagreements"] = int(np.count_nonzero(flips)), int(np.count_nonzero(near))
        # the bar counts a flipped near-tie as agreeing: the float model has not decided there (with 64 golden
        # samples at 99%, one coin flip would fail any build); top1_agreement itself stays the plain share
        judged = agree + out["near_tie_disagreements"] / max(1, len(r2))
        task = ("top-1 agreement %.1f%% meets its bar (%.0f%%)" % (100 * judged, 100 * tol["min_top1_agreement"]),
                judged >= tol["min_top1_agreement"], "top1_agreement")
        if not judged >= tol["min_top1_agreement"]:
            failures.append("output %r: top-1 agrees with float on %.1f%% of %d golden %s (needs %.0f%%%s)%s" % (
                name, 100 * judged, len(r2), "positions" if per_pos else "samples", 100 * tol["min_top1_agreement"],
                at, "; %d of the %d disagreements are near-ties (float's top-2 margin under 1%% of the output range),"
                " counted as agreeing" % (out["near_tie_disagreements"], out["disagreements"])
                if out["near_tie_disagreements"] else ""))
    elif kind == "regression" and not bad:
        noise = float(np.sum((got64 - ref64) ** 2))
        signal = float(np.sum(ref64 ** 2))
        snr = float("inf") if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else float("-inf"))
        norms = np.linalg.norm(ref64.reshape(n, -1), axis=1) * np.linalg.norm(got64.reshape(n, -1), axis=1)
        dots = np.sum(ref64.reshape(n, -1) * got64.reshape(n, -1), axis=1)
        cos = float(np.mean(np.where(norms > 0, dots / np.where(norms > 0, norms, 1), 1.0))) if n else 1.0
        out["snr_db"], out["cosine"] = snr, cos
        if tol.get("min_snr_db") is not None:
            task = ("SNR %.1f dB meets its bar (%.0f dB)" % (snr, tol["min_snr_db"]), snr >= tol["min_snr_db"],
                    "snr_db")
        if tol.get("min_snr_db") is not None and not snr >= tol["min_snr_db"]:
            failures.append("output %r: SNR %.1f dB against the float output (needs %.0f dB%s)" % (
                name, snr, tol["min_snr_db"], at))
    elif kind == "mask" and not bad and not empty_mask:  # an empty mask has no IoU: its values were judged above
        r, g = ref64 >= 0.5, got64 >= 0.5
        iou = float(np.count_nonzero(r & g)) / float(np.count_nonzero(r | g))
        out["iou"] = iou
        if not iou >= tol.get("min_iou", 0.9):
            failures.append("output %r: mask IoU %.3f at threshold 0.5 (needs %.2f%s)" % (
                name, iou, tol.get("min_iou", 0.9), at))
    elif kind == "detection" and not bad and not empty_mask:
        # judged as a user of the detector would: the same anchors detected (IoU of the detected sets, as a mask's),
        # and their boxes (SNR over the anchors the float model detects); background anchors' values do not count
        r, g = _detected(ref64), _detected(got64)
        iou = float(np.count_nonzero(r & g)) / float(np.count_nonzero(r | g))
        boxes_ref, boxes_got = ref64[..., :4][r], got64[..., :4][r]
        noise = float(np.sum((boxes_got - boxes_ref) ** 2))
        snr = float("inf") if noise == 0 else 10 * np.log10(max(float(np.sum(boxes_ref ** 2)), 1e-300) / noise)
        out["iou"], out["snr_db"], out["detections"] = iou, snr, int(np.count_nonzero(r))
        if not iou >= tol.get("min_iou", 0.9):
            failures.append("output %r: detections (score >= %g) overlap the float model's with IoU %.3f over %d "
                            "anchors (needs %.2f%s)" % (name, DET_SCORE, iou, int(np.count_nonzero(r | g)),
                                                        tol.get("min_iou", 0.9), at))
        if r.any() and tol.get("min_snr_db") is not None and not snr >= tol["min_snr_db"]:
            failures.append("output %r: boxes of the detected anchors at SNR %.1f dB against float (needs %.0f dB%s)" % (
                name, snr, tol["min_snr_db"], at))
    elif kind == "ctc" and not bad:
        # judged as the recogniser's user reads it: the decoded text (exact per sample, and the character error
        # rate), and the line confidence an OCR pipeline thresholds (RapidOCR drops lines under 0.5)
        dec = [(_ctc_decode(r), _ctc_decode(g)) for r, g in zip(ref64, got64)]
        same = float(np.mean([a[0] == b[0] for a, b in dec])) if dec else 1.0
        chars = sum(len(a[0]) for a, _ in dec)
        cer = sum(_edits(a[0], b[0]) for a, b in dec) / max(1, chars)
        dconf = max([abs(a[1] - b[1]) for a, b in dec] or [0.0])
        out.update(text_agreement=same, cer=cer, confidence_max_diff=dconf, characters=chars,
                   min_text_agreement=tol["min_top1_agreement"])
        if not same >= tol["min_top1_agreement"]:
            failures.append("output %r: the decoded text matches float on %.1f%% of %d samples (needs %.0f%%%s); "
                            "character error rate %.2f%% over %d characters" % (
                                name, 100 * same, n, 100 * tol["min_top1_agreement"], at, 100 * cer, chars))
        if not dconf <= max(tol["max_rel_error"], floor):
            failures.append("output %r: a line's confidence moves by %.3f (tolerance %.3f%s)" % (
                name, dconf, max(tol["max_rel_error"], floor), at))
    elif kind == "index" and not bad:
        exact = float(np.mean(got64 == ref64)) if ref64.size else 1.0
        out["exact_match"] = exact
        if not exact >= tol.get("min_exact", 0.99):
            failures.append("output %r: %.1f%% of indices match the float model (needs %.0f%%%s)" % (
                name, 100 * exact, 100 * tol.get("min_exact", 0.99), at))
    # the worst sample: where the kind's task metric is set (top-1 agreement, SNR) and passes, max error over its
    # bound is reported as a warning and does not fail the output alone (one sample would outvote the measure of
    # the task on every sample); it decides where there is no task metric, where that metric fails too, or where
    # the tolerance says so (max_error_decides)
    warnings = []
    decides = task is None or not task[1] or bool(tol.get("max_error_decides"))
    if over and decides:
        failures.insert(at_over, over)
    elif over:
        warnings.append("%s: reported, not deciding: %s (--tolerance max_error_decides=true fails on it)" % (
            over, task[0]))
    if bad:
        out["decided_by"] = ["finite" if bad > 0 else "shape"]
    else:
        gates = {"mask": ["iou"], "index": ["exact_match"],
                 "detection": ["iou"] + (["snr_db"] if tol.get("min_snr_db") is not None else []),
                 "ctc": ["text_agreement", "line_confidence"]}.get(kind, [task[2]] if task else [])
        if empty_mask:  # no decision in either model: its values decide
            gates = []
        out["decided_by"] = gates + (["max_rel_error"] if decides and (kind in ("class", "regression")
                                                                         or empty_mask) else [])
    out["passed"] = not failures
    out["failures"] = failures
    out["warnings"] = warnings
    return out


def output_batch_axis(shape, batch):
    """The axis of one run's output that holds the run's ``batch`` samples: 0 where its size is the batch (the
    usual layout); else the one axis of that size (a time-major CTC recogniser's [T, N, classes], a recurrent
    state [layers, N, hidden]); 0 where no axis or several have it (the output is then merged as it always was)."""
    shape = tuple(shape)
    if not shape or shape[0] == batch:
        return 0
    hits = [i for i, s in enumerate(shape) if s == batch]
    return hits[0] if len(hits) == 1 else 0


def merge_batches(parts, batch, axes=None):
    """Per-run outputs (a list, one list of arrays per run of ``batch`` samples) -> (one array per output with
    the samples on axis 0, the batch axis each output had). An output whose batch is on another axis is joined
    on it and moved first, so every check reads [samples, ...]; ``axes`` (the manifest's, recorded on the host)
    overrides the inference, so the board merges exactly as the host did."""
    merged, used = [], []
    for k in range(len(parts[0])):
        arrs = [np.asarray(p[k]) for p in parts]
        if arrs[0].ndim == 0:
            arrs = [a.reshape(1) for a in arrs]
        ax = output_batch_axis(arrs[0].shape, batch) if axes is None or axes[k] is None else axes[k]
        if ax == "none":  # no batch axis: each run's output is one sample's
            merged.append(np.stack(arrs))
            used.append(ax)
            continue
        ax = int(ax)
        if not 0 <= ax < arrs[0].ndim:
            raise ValueError("output %d: batch_axis %d is not an axis of its %d-d output (manifest.json: "
                             "rebuild the bundle)" % (k, ax, arrs[0].ndim))
        joined = np.concatenate(arrs, axis=ax)
        merged.append(np.moveaxis(joined, ax, 0) if ax else joined)
        used.append(ax)
    return merged, used


def compare(outputs, golden, manifest):
    """Per output, by its kind (recorded in the manifest at conversion; inferred for older bundles)."""
    tol = manifest["tolerance"]
    specs = manifest["golden"]["outputs"]
    checks = []
    for spec, got in zip(specs, outputs):
        ref = golden[spec["key"]]
        kind = spec.get("kind") or infer_kind(ref, len(specs))
        checks.append(check_output(spec["name"], kind, ref, got, tol))
    return checks


def run_batch(ins):
    """The samples one run takes: the batch-axis size of the first golden input that has a batch axis
    (``batch_axis`` in the manifest: absent = 0, "none" = the input has none), else 1."""
    for s in ins:
        ax = s.get("batch_axis") or 0
        if ax != "none" and s["shape"]:
            return int(s["shape"][ax])
    return 1


def golden_feeds(golden, manifest):
    """The golden inputs as model-sized batches: a list of {input name: array} (the name in the artifact:
    ``runtime_name`` where its format renamed the input). The golden arrays hold samples first; each input's
    samples go to its batch axis (a recurrent state [layers, N, H]: axis 1), or, where it has none, one a run."""
    ins = manifest["golden"]["inputs"]
    bs = run_batch(ins)

    def place(s, part):
        ax = s.get("batch_axis") or 0
        return part[0] if ax == "none" else np.moveaxis(part, 0, ax) if ax else part

    return [{s.get("runtime_name") or s["name"]: place(s, golden[s["key"]][i:i + bs]) for s in ins}
            for i in range(0, manifest["golden"]["samples"], bs)]


def carried_pairs(manifest):
    """The manifest's carried states (``--carry OUT=IN``): [(output name, input name)], empty where none."""
    return [(p["output"], p["input"]) for p in (manifest.get("carry") or {}).get("pairs") or []]


def run_carried(run, golden, manifest):
    """``run(feed) -> list of outputs`` over the golden chunks in order, the model carrying its OWN state: the
    first chunk takes the golden state (the start of a sequence), every later one the state output ``run`` handed
    back for the chunk before it, as the model runs in use. The golden outputs are the float model's over the
    same sequence carrying its own state, so they are compared as they are. Per chunk, its outputs."""
    pairs = carried_pairs(manifest)
    at = {s["name"]: k for k, s in enumerate(manifest["golden"]["outputs"])}
    key = {s["name"]: s.get("runtime_name") or s["name"] for s in manifest["golden"]["inputs"]}
    outs, state = [], {}
    for feed in golden_feeds(golden, manifest):
        for i, x in state.items():
            want = np.asarray(feed[key[i]])
            feed[key[i]] = np.ascontiguousarray(np.asarray(x).reshape(want.shape).astype(want.dtype))
        got = run(feed)
        outs.append(got)
        state = {i: got[at[o]] for o, i in pairs}
    return outs


class Smoke(object):
    """Collects checks and writes smoke_result.json; one per runner invocation."""

    def __init__(self, bundle, manifest, out_path, **extra):
        self.bundle, self.manifest, self.out_path = bundle, manifest, out_path
        self.result = {"bundle": manifest.get("name"), "board": manifest.get("board", {}).get("id"),
                       "precision": manifest.get("precision"), "host": platform.node(),
                       "machine": platform.machine(), "python": platform.python_version(), "checks": [],
                       "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.result.update(extra)
        self.budgets = manifest.get("budgets", {}) or {}

    def add(self, name, passed, detail, **extra):
        item = {"name": name, "passed": passed, "detail": detail}
        item.update(extra)
        self.result["checks"].append(item)
        log("%s %s: %s" % ("PASS" if passed else ("FAIL" if passed is False else "----"), name, detail))

    def integrity(self):
        bad = check_integrity(self.bundle, self.manifest)
        self.add("integrity", not bad,
                 "; ".join(bad) if bad else "all %d files the manifest lists match their sha256"
                 % len(self.manifest["files"]))
        return not bad

    def loaded(self, name):
        self.add("load", True, name)
        self.result["runtime"] = name

    def golden(self, run, golden):
        """``run(feed) -> list of outputs`` over every golden batch, compared with the manifest's tolerance. With
        a carried state (manifest ``carry``) the golden chunks are one sequence, run in order with the model's
        own state fed back from chunk to chunk (:func:`run_carried`)."""
        pairs = carried_pairs(self.manifest)
        outs = (run_carried(run, golden, self.manifest) if pairs
                else [run(feed) for feed in golden_feeds(golden, self.manifest)])
        specs = self.manifest["golden"]["outputs"]
        merged, _ = merge_batches(outs, run_batch(self.manifest["golden"]["inputs"]),
                                  [s.get("batch_axis", 0) for s in specs])
        per = compare(merged, golden, self.manifest)
        for c in per:
            for w in c["warnings"]:
                log("WARN golden: %s" % w)
        worst = max(per, key=lambda c: c["max_rel_error"])
        carried = ("; state carried chunk to chunk (%s)" % ", ".join("%s -> %s" % p for p in pairs)) if pairs else ""
        self.add("golden", all(c["passed"] for c in per),
                 "%d samples%s; worst output %r max error %.3g (%.2f%% of range, tolerance %.2f%%)%s" % (
                     self.manifest["golden"]["samples"], carried, worst["output"], worst["max_abs_error"],
                     100 * worst["max_rel_error"], 100 * worst["tolerance_rel"],
                     "" if worst["top1_agreement"] is None
                     else ", top-1 agreement %.1f%%" % (100 * worst["top1_agreement"])),
                 outputs=per, **({"carried": [{"output": o, "input": i} for o, i in pairs]} if pairs else {}))

    def latency(self, call, warmup, iters, judge=True, label="", note="", on_device=True):
        """Time ``call()`` after warm-up; judged against the latency budget on p90 unless ``judge`` is False.

        ``on_device=False`` marks a measurement taken off the board (e.g. a Mac for an iPhone
        bundle): it is recorded as such and never recalibrates the board's cost model.
        """
        for _ in range(warmup):
            call()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000.0)
        lat = {"p50": float(np.percentile(times, 50)), "p90": float(np.percentile(times, 90)),
               "p99": float(np.percentile(times, 99)), "mean": float(np.mean(times)),
               "iters": len(times), "warmup": warmup, "on_device": bool(on_device)}
        self.result["latency_ms"] = lat
        budget = self.budgets.get("latency_ms")
        detail = "%sp50 %.3f / p90 %.3f / p99 %.3f ms" % (label, lat["p50"], lat["p90"], lat["p99"])
        if judge and budget:
            self.add("latency", lat["p90"] <= budget, detail + "; budget %.3g ms (on p90)" % budget, budget_ms=budget)
        else:
            self.add("latency", None, detail + ("; " + note if note else "; no budget"))
        return lat

    def memory(self, judge=True, note=""):
        rss = peak_rss_mb()
        self.result["peak_rss_mb"] = rss
        budget = self.budgets.get("ram_mb")
        shown = fmt_mb(rss) if rss is not None else "unknown"
        if judge and rss is not None and budget:
            self.add("memory", rss <= budget, "peak RSS %s MB; budget %s MB" % (shown, fmt_mb(budget)), budget_mb=budget)
        else:
            self.add("memory", None, "peak RSS %s MB%s" % (shown, note))

    def power(self, watts=None, samples=0, source="", why_not=""):
        self.result["power_w"] = watts
        if watts is None:
            self.add("power", None, "not measured: " + why_not)
            return
        budget = self.budgets.get("power_w")
        self.add("power", watts <= budget if budget else None,
                 "mean %.2f W over %d samples (%s); budget %s W" % (watts, samples, source, budget))

    def finish(self, loaded):
        """Write smoke_result.json atomically; the exit code: 0 passed, 1 a check failed."""
        r = self.result
        r["passed"] = bool(loaded) and all(c["passed"] is not False for c in r["checks"])
        r["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tmp = self.out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(r, f, indent=2)
        os.replace(tmp, self.out_path)
        log("%s -> %s" % ("PASSED" if r["passed"] else "FAILED", self.out_path))
        return 0 if r["passed"] else 1


def read_manifest(bundle):
    with open(os.path.join(bundle, "manifest.json")) as f:
        return json.load(f)
