"""Agreement with float measured on many more held-out inputs than a build verifies on (issue 15).

The zoo's ppocr-cls file holds 160 text lines: convert calibrates on 59 and checks on the other 101, where one
disagreement is a point of agreement and the 95% interval of "99%" spans about 94.6-99.8%. This builds ppocr-cls
(as bench/accuracy.py does: a real pipeline run on the zoo's file) and runs each artifact on ``--n`` more text
lines made by the zoo's own recipe with another seed (zoo/data.py ``_text_lines``: other windows of the scanned
page, the sentences typeset again at other sizes, positions and blurs), against the float ONNX model in
onnxruntime. A line the recipe drew exactly again (one of the zoo's 160, one of the 640 the c400 file adds, or a
repeat) is left out, and the count said: with seed 11, 6 of 1000 (before the twenty-second session they counted).
Per build: its verdict and agreement on the zoo's 101, then on the new lines with a Wilson 95% interval, how many
of its disagreements are float near-ties (top-2 margin under 0.02), and the output SNR.

``--orientation``: each measured line is also fed turned 180 degrees, and the lines carry the label the model
is there to give (class 0 upright, class 1 turned; PaddleOCR's ``['0', '180']``). That is a labelled set for the
accuracy bar (issue 15: within 0.5 points of float) besides agreement: float accuracy, the build's, and the drop
with a paired 95% interval (the lines the two get wrong differently, conditional on their count).
``--model`` builds another model file of ppocr-cls instead of the zoo's (a fine-tuned ``.pt2``).

    python bench/heldout.py [--targets android jetson] [--builds b c a16] [--n 1000] [--seed 11] [--orientation]

builds: b = the new PTQ (calibration=auto); c = (b) held to 99% agreement, so mixed precision runs where it
fails (bench/accuracy.py's column (c)); c400 = (c) checked on 400 golden lines instead of 64 (64 cannot show 99%:
all 64 agreeing proves only 94.3%), from the zoo's 160 lines and 640 more (seed 12); a16 = android with 16-bit
activations (--option activations=int16).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

# name: (options, tolerance, strict, golden samples); strict as bench/accuracy.py: (b) without mixed precision.
# c400: (c) checked on 400 golden samples, enough to show 99% (edgekit warns under 381), from a file of the zoo's
# 160 lines and 640 more (seed 12; none of the measured lines)
BUILDS = {"b": ({"calibration": "auto"}, None, True, None),
          "c": ({"calibration": "auto"}, {"min_top1_agreement": 0.99}, False, None),
          "c400": ({"calibration": "auto"}, {"min_top1_agreement": 0.99}, False, 400),
          "a16": ({"activations": "int16"}, None, True, None)}
MORE_SEED = 12
NEAR_TIE = 0.02


def lines(n: int, seed: int) -> np.ndarray:
    from zoo.data import text_lines_rgb

    return text_lines_rgb(48, 192, n, seed=seed)  # the zoo's ppocr-cls data, other lines


def unseen(x: np.ndarray, *seen: np.ndarray) -> np.ndarray:
    """Indices of the lines of ``x`` that are in none of ``seen`` and not repeated in ``x`` (first kept): the
    recipe draws windows of one scanned page, so another seed can give a line exactly again (seed 11's 1000 lines
    hold 5 of seed 12's 640, which the c400 file and fine-tuning runs train or calibrate on, and one twice)."""
    import hashlib

    def key(a: np.ndarray) -> bytes:
        return hashlib.sha256(np.ascontiguousarray(a).tobytes()).digest()

    taken = {key(a) for s in seen for a in s}
    keep = []
    for i, a in enumerate(x):
        k = key(a)
        if k not in taken:
            taken.add(k)
            keep.append(i)
    return np.array(keep, dtype=np.int64)


def more(spec: dict, work: Path) -> dict:
    """The spec on a file of the zoo's 160 lines and 640 more (seed MORE_SEED), for a check on 400 golden lines."""
    f = work / "ppocr-cls-800.npz"
    if not f.exists():
        x = np.load(spec["calib"])["x"]
        np.savez(f, x=np.concatenate([x, lines(640, MORE_SEED)]))
    return {**spec, "calib": str(f), "eval": str(f)}


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of k successes in n (scipy)."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


def runner(out: Path, target: str):
    """The artifact on the host as verification runs it, through the bundle's own runner classes: LiteRT
    (android), onnxruntime on the Q/DQ ONNX with the session settings the board's fallback uses (jetson's host
    check; TensorRT runs it on the device). A plain onnxruntime session is not that: on an AVX2 CPU without VNNI
    its fused int8 kernels saturate (firmware/tensorrt/run.py), and ppocr-cls jetson measures 86.9% where
    verification measures 96.0% on the same lines."""
    from edgekit.converters import load_firmware

    man = json.loads((out / "manifest.json").read_text())
    art = out / man["artifact"]["primary"]
    if target == "android":
        m = load_firmware("tflite").LiteRTModel(str(art), 2, man["artifact"].get("layout") == "nhwc",
                                                "ai_edge_litert")
        return lambda x: m([x])[0]
    s = load_firmware("tensorrt").OnnxRuntimeModel(str(art))
    name = s.sess.get_inputs()[0].name
    return lambda x: s({name: x})[0]


def turned(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lines upright and turned 180 degrees ([N, C, H, W] -> [2N, ...]) with the class ppocr-cls should give:
    0 upright, 1 turned (its label list is ['0', '180'])."""
    both = np.concatenate([x, x[:, :, ::-1, ::-1]])
    return np.ascontiguousarray(both), np.repeat(np.array([0, 1], dtype=np.int64), len(x))


def measure(run, x: np.ndarray, ref: np.ndarray, labels: np.ndarray | None = None) -> dict:
    got = np.concatenate([run(x[i:i + 1]) for i in range(len(x))]).reshape(ref.shape)
    miss = np.flatnonzero(got.argmax(1) != ref.argmax(1))
    top2 = np.sort(ref, 1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    lo, hi = wilson(len(x) - len(miss), len(x))
    snr = 10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / float(((got - ref).astype(np.float64) ** 2).sum()))
    out = {"agree": 1 - len(miss) / len(x), "ci95": (lo, hi), "misses": len(miss),
           "near_ties": int((margin[miss] < NEAR_TIE).sum()), "snr_db": snr}
    if labels is None:
        return out
    from edgekit.verify import accuracy_drop

    f_ok, q_ok = ref.argmax(1) == labels, got.argmax(1) == labels
    d = accuracy_drop(f_ok, q_ok)
    return {**out, "float_acc": float(f_ok.mean()), "acc": float(q_ok.mean()), "drop": d["drop"],
            "drop_ci95": d["ci95"], "lost": d["lost"], "won": d["won"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["android", "jetson"], choices=["android", "jetson"])
    ap.add_argument("--builds", nargs="+", default=["b", "c", "a16"], choices=list(BUILDS))
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--orientation", action="store_true",
                    help="also feed each line turned 180 degrees, labelled: accuracy against float besides agreement")
    ap.add_argument("--model", type=Path, default=None, help="a ppocr-cls model file to build instead of the zoo's")
    ap.add_argument("--seen", type=Path, nargs="*", default=[],
                    help=".npz files of lines to leave out (a --model's fine-tuning data): their array 'x'")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import accuracy as A
    import onnxruntime as ort

    rows = []
    with tempfile.TemporaryDirectory(prefix="edgekit-bench-heldout-") as tmp:
        work = Path(tmp)
        zoo = spec = A.models(work, ["ppocr-cls"])[0]
        if args.model:  # a .pt2 holds its input shape
            spec = {**zoo, "model": str(args.model.resolve()), "input_shape": None}
        x = lines(args.n, args.seed)
        seen = []
        for f in [spec["calib"], *args.seen]:  # the zoo's 160 lines, and --seen's
            with np.load(f) as z:
                seen.append(z["x"])
        keep = unseen(x, *seen, lines(640, MORE_SEED))  # and the c400 file's 640
        if len(keep) < len(x):
            print(f"{len(x) - len(keep)} of the {len(x)} lines (seed {args.seed}) are also in the zoo's file or the "
                  f"640 more (seed {MORE_SEED}){', or in --seen' if args.seen else ''}, or repeated: left out, "
                  f"{len(keep)} measured", flush=True)
            x = x[keep]
        labels = None
        if args.orientation:
            x, labels = turned(x)
        # the reference is the zoo's float ONNX, also for a --model: agreement with the model it came from
        s = ort.InferenceSession(zoo["model"], providers=["CPUExecutionProvider"])
        ref = np.concatenate([s.run(None, {s.get_inputs()[0].name: x[i:i + 1]})[0] for i in range(len(x))])
        near = int((np.diff(np.sort(ref, 1)[:, -2:], axis=1)[:, 0] < NEAR_TIE).sum())
        what = f"{len(x) // 2} text lines upright and turned" if args.orientation else f"{len(x)} text lines"
        print(f"{what} (seed {args.seed}): {near} float near-ties (top-2 margin < {NEAR_TIE})", flush=True)
        if labels is not None:
            print(f"float accuracy on the orientation: {(ref.argmax(1) == labels).mean():.2%}", flush=True)
        for target in args.targets:
            for b in args.builds:
                if b == "a16" and target != "android":
                    continue
                opts, tol, strict, golden = BUILDS[b]
                out = work / f"{target}-{b}"
                t0 = time.perf_counter()
                r = A.build(more(spec, work) if golden else spec, target, out, opts, strict=strict, tolerance=tol,
                            golden=golden)
                row = {"target": target, "build": b, "cell": A.cell(r, kept=True)}
                if "error" not in r:
                    row.update(measure(runner(out, target), x, ref, labels))
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                print(json.dumps(row, default=str), flush=True)
    from edgekit import stages

    c400 = len(stages.held_out(800, None, stages.draw(800, 400, None, seed=stages.GOLDEN_SEED)))  # as the data stage draws
    acc = labels is not None
    unit = "samples (lines upright and turned)" if acc else "lines"
    print(f"\nppocr-cls: agreement with float on the build's held-out eval lines (its cell: the zoo's 101; c400: "
          f"{c400} of the 800) and on {len(x)} more {unit} (seed {args.seed})\n")
    head = " float acc | accuracy | drop, points (paired 95%) |" if acc else ""
    print(f"| target | build | the build (its eval lines) | {len(x)} {unit}: agreement (Wilson 95%) | disagreements "
          f"(float near-ties) | output SNR |{head}")
    print("|---|---|---|---|---|---|" + ("---|---|---|" if acc else ""))
    for r in rows:
        if "agree" not in r:
            print(f"| {r['target']} | {r['build']} | {r['cell']} | — | — | — |" + (" — | — | — |" if acc else ""))
            continue
        lo, hi = r["ci95"]
        tail = ""
        if acc:
            dlo, dhi = r["drop_ci95"]
            tail = (f" {100 * r['float_acc']:.2f}% | {100 * r['acc']:.2f}% | {r['drop']:.2f} ({dlo:.2f} to {dhi:.2f}; "
                    f"{r['lost']} lost, {r['won']} won) |")
        print(f"| {r['target']} | {r['build']} | {r['cell']} | {100 * r['agree']:.2f}% ({100 * lo:.2f}-{100 * hi:.2f}) "
              f"| {r['misses']} ({r['near_ties']}) | {r['snr_db']:.1f} dB |{tail}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
