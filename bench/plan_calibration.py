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
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # plan_nets: the MobileNetV2-shaped network


def mobilenetv2_w05():
    from plan_nets import MobileNetV2

    import torch

    torch.manual_seed(0)
    return MobileNetV2(width=0.5).eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--save", type=Path, help="write the measurements (JSON) here")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from edgekit.calibrate import default_models, fit, measure, median_abs_error, predict
    from edgekit.profiles import load_board

    board = load_board("host")
    fitted_on = default_models()
    held_out = [("plan_nets:mobilenetv2", ["1,3,96,96"], "random"),
                ("plan_calibration:mobilenetv2_w05", ["1,3,128,128"], "random")]
    train = measure(board.id, fitted_on, iterations=args.iterations)
    test = measure(board.id, held_out, iterations=args.iterations)
    if args.save:
        import json

        args.save.write_text(json.dumps({"train": train, "test": test}))
    f = fit(train)
    eff0, l0 = dict(board.efficiency), board.launch_overhead_us
    print(f"fit (on {len(train)} measurements): efficiency {f['efficiency']}, bandwidth x{f['bandwidth_factor']:.3g}, "
          f"launch {f['launch_overhead_us']:.1f} us")
    print(f"{'model':<36} {'prec':<5} {'measured':>9} {'before':>9} {'after':>9}  (ms)")
    for name, group in (("fitted", train), ("held out", test)):
        for s in group:
            before = predict(s, eff0.get(s["precision"], 0.25), l0)
            after = predict(s, f["efficiency"][s["precision"]], f["launch_overhead_us"], f["bandwidth_factor"])
            print(f"{Path(s['model']).name[:28] + ' (' + name + ')':<36} {s['precision']:<5} "
                  f"{s['measured_latency_ms']:9.4f} {before:9.4f} {after:9.4f}")
    for name, group in (("fitted models", train), ("held-out models", test), ("all", train + test)):
        b = median_abs_error(group, eff0, l0)
        a = median_abs_error(group, f["efficiency"], f["launch_overhead_us"], f["bandwidth_factor"])
        print(f"median |estimate - measured| / measured, {name}: before {b:.1%}, after {a:.1%}")
    print(f"({np.__name__} {np.__version__}; host profile peak fp32 {board.power_modes[board.default_power_mode].peak_tops['fp32']} TOPS)")


if __name__ == "__main__":
    main()
