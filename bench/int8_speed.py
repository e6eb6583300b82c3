"""INT8 against float, per model and target, side by side in one run: build time (each cell in its own process,
build cache off, as `edgekit zoo run` runs it) and artifact latency on the target's host runtime (android:
LiteRT with XNNPACK on one thread, the INT8 build and the fp32 build timed in turns by the speed stage).

    python bench/int8_speed.py                         # the repo's digits CNN on android and jetson
    python bench/int8_speed.py -m ppocr-cls oww-alexa  # zoo models (edgekit zoo fetch first)
    python bench/int8_speed.py -m ppocr-cls -t android

Prints one row per model and target: fp32 and int8 build seconds and their ratio, the artifact latencies and the
INT8 build's speed-up, and the INT8 cell's verdict. jetson's latency column is empty: onnxruntime on this CPU
says nothing about TensorRT (bench/trt_speed.sh times the engines where a GPU is).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"digits": ROOT / "examples" / "digits" / "digits_cnn.pt2"}
FLOAT = {"jetson": "fp32", "android": "fp32", "ios": "fp16"}


def example_cells(name: str, target: str, out: Path) -> dict[str, dict]:
    """The example model's float and int8 builds in this process, each timed from the call to its return."""
    import time

    from edgekit.pipeline import convert

    calib = ROOT / "examples" / "digits" / "calib.npz"
    cells = {}
    for p in (FLOAT[target], "int8"):
        t0 = time.perf_counter()
        try:
            res = convert(EXAMPLES[name], target, out / f"{name}-{target}-{p}", precision=p, calib=str(calib),
                          cache=False, fail_on_verification=False)
            status = "pass" if res.verification.passed else "failed"
            reason = "; ".join(res.verification.failures)[:100]
        except Exception as exc:  # noqa: BLE001 - a refusal is a row too
            status, reason = "refused", str(exc)[:100]
        cells[p] = {"status": status, "seconds": round(time.perf_counter() - t0, 1), "reason": reason,
                    "out": str(out / f"{name}-{target}-{p}")}
    return cells


def zoo_cells(name: str, target: str, out: Path) -> dict[str, dict]:
    from edgekit.zoo import select
    from edgekit.zoo.run import prepare_data, run_cell

    m = select([name])[0]
    data = prepare_data(m)
    cells = {}
    for p in (FLOAT[target], "int8"):
        res = run_cell(m, target, p, data, out, cache=False)
        res["out"] = str(out / f"{name}-{target}-{p}")
        cells[p] = res
    return cells


def latencies(cells: dict[str, dict], target: str) -> tuple[str, str, str]:
    """(float ms, int8 ms, speed-up) from the builds' manifests; android only."""
    man = Path(cells["int8"]["out"]) / "manifest.json"
    if target != "android" or not man.is_file():
        return "", "", ""
    sp = json.loads(man.read_text())["artifact"].get("speed")
    if not sp:
        return "", "", ""
    return f"{sp['float_ms']:.4g}", f"{sp['ms']:.4g}", f"{sp['speedup']:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", nargs="*", default=None, help="zoo models (default: the repo's examples)")
    ap.add_argument("-t", "--targets", nargs="*", default=["android", "jetson"])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in args.models or list(EXAMPLES):
            for t in args.targets:
                out = Path(d) / "builds"
                cells = zoo_cells(name, t, out) if args.models else example_cells(name, t, out)
                f, q = cells[FLOAT[t]], cells["int8"]
                fl_ms, q_ms, up = latencies(cells, t)
                ratio = q["seconds"] / f["seconds"] if f["seconds"] else float("nan")
                rows.append((name, t, f"{f['seconds']:.1f}", f"{q['seconds']:.1f}", f"{ratio:.1f}x", fl_ms, q_ms, up,
                             q["status"] + (f" ({q.get('reason', '')[:60]})" if q["status"] != "pass" else "")))
                print(" | ".join(rows[-1]), flush=True)
    head = ("model", "target", "float build s", "int8 build s", "int8/float", "float ms", "int8 ms", "int8 speed-up",
            "int8 verdict")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
