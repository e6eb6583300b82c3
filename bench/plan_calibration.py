"""Host board: the cost model's latency estimate vs onnxruntime measurement, before and after calibration.

    python bench/plan_calibration.py [--iterations 50]

Builds each model at fp32/fp16/int8 with the real pipeline, times it on this CPU
(onnxruntime, the host board's runtime), then fits the host board's efficiency factors,
bandwidth factor and launch overhead (edgekit.calibrate.fit) on the micro-benchmarks and
the digits example only, and reports the median absolute error before and after: on the
fitted models and on held-out MobileNetV2-shaped networks the fit never saw.
Nothing is written to the user's calibration store.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # plan_nets: the MobileNetV2-shaped network


def mobilenetv2_w05():
    from plan_nets import MobileNetV2

    import torch

    torch.manual_seed(0)
    return MobileNetV2(width=0.5).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--save", type=Path, help="write the measurements (JSON) here")
    ap.add_argument("--load", type=Path, help="fit and report measurements saved by --save (no building or timing)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from edgekit.calibrate import constants, default_models, fit, measure, median_abs_error, predict
    from edgekit.hostcpu import detect
    from edgekit.profiles import load_board

    board = load_board("host")
    if args.load:
        data = json.loads(args.load.read_text())
        train, test = data["train"], data["test"]
    else:
        held_out = [("plan_nets:mobilenetv2", ["1,3,96,96"], "random"),
                    ("plan_calibration:mobilenetv2_w05", ["1,3,128,128"], "random")]
        log = lambda m: print("  " + m, file=sys.stderr, flush=True)  # noqa: E731
        fitted_on = default_models()
        # one run: the timing rounds take turns over every model, fitted and held out alike
        both = measure(board.id, fitted_on + held_out, iterations=args.iterations, log=log)
        n = len(both) // (len(fitted_on) + len(held_out)) * len(fitted_on)
        train, test = both[:n], both[n:]
        if args.save:
            args.save.write_text(json.dumps({"train": train, "test": test}))
    start = constants(board)
    f = fit(train, start)
    cpu = detect()
    print(f"host: {cpu.describe() if cpu else 'CPU not readable here (no /proc/cpuinfo): host.toml figures'}")
    print(f"fit on {len(train)} measurements of the micro-benchmarks + digits (held-out models never seen):")
    for k in ("efficiency", "class_efficiency", "activation_passes"):
        print(f"  {k:<18} profile {_fmt(start[k])}  ->  fitted {_fmt(f[k])}")
    print(f"  launch overhead    profile {start['launch_overhead_us']:.2f} us  ->  fitted {f['launch_overhead_us']:.2f} us;"
          f" bandwidth x{f['bandwidth_factor']:.3g}")
    print(f"{'model':<44} {'prec':<5} {'measured':>9} {'before':>9} {'after':>9}  (ms)")
    for name, group in (("fitted", train), ("held out", test)):
        for s in group:
            before, after = predict(s, start), predict(s, f)
            label = Path(s["model"].split(" @")[0]).name[:28] + (" @" + s["model"].split(" @")[1] if " @" in s["model"] else "")
            print(f"{label[:34] + ' (' + name + ')':<44} {s['precision']:<5} "
                  f"{s['measured_latency_ms']:9.4f} {before:9.4f} {after:9.4f}")
    for name, group in (("fitted models", train), ("held-out models", test), ("all", train + test)):
        b = median_abs_error(group, start)
        a = median_abs_error(group, f)
        print(f"median |estimate - measured| / measured, {name}: before {b:.1%}, after {a:.1%}")


def _fmt(d: dict) -> str:
    return "{" + ", ".join(f"{k} {v:.3g}" for k, v in sorted(d.items())) + "}"


if __name__ == "__main__":
    main()
