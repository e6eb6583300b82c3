#!/usr/bin/env python3
"""Parse TFLite benchmark_model output into bench_result.json (used by push_and_bench.sh).

benchmark_model prints e.g.
  Inference timings in us: Init: 2410, First inference: 1830, Warmup (avg): 901.2, Inference (avg): 873.5
Exit 0 when the average is within --budget-ms (or no budget), 1 when over, 2 when unparsable.
"""

import argparse
import json
import re
import sys

TIMINGS = re.compile(r"Inference timings in us:\s*(.*)")
FIELD = re.compile(r"([A-Za-z ()]+):\s*([0-9.eE+-]+)")
MEMORY = re.compile(r"Peak memory footprint \(MB\): init=([0-9.]+) overall=([0-9.]+)")


def parse(text):
    lines = TIMINGS.findall(text)
    if not lines:
        return None
    fields = {k.strip(): float(v) for k, v in FIELD.findall(lines[-1])}
    out = {
        "init_us": fields.get("Init"),
        "first_inference_us": fields.get("First inference"),
        "warmup_avg_us": fields.get("Warmup (avg)"),
        "inference_avg_us": fields.get("Inference (avg)"),
    }
    mem = MEMORY.search(text)
    if mem:
        out["peak_memory_mb"] = {"init": float(mem.group(1)), "overall": float(mem.group(2))}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--budget-ms", default="")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--delegate", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--output", default="bench_result.json")
    a = ap.parse_args(argv)
    with open(a.log) as f:
        res = parse(f.read())
    if res is None or res["inference_avg_us"] is None:
        print("[edgekit-bench] no 'Inference timings in us' line in %s" % a.log)
        return 2
    avg_ms = res["inference_avg_us"] / 1000.0
    budget = float(a.budget_ms) if a.budget_ms else None
    res.update({"device": a.device, "threads": a.threads, "delegate": a.delegate, "latency_avg_ms": avg_ms,
                "budget_ms": budget, "passed": budget is None or avg_ms <= budget})
    with open(a.output, "w") as f:
        json.dump(res, f, indent=2)
    print("[edgekit-bench] %s: average %.3f ms%s -> %s" % (
        "PASS" if res["passed"] else "FAIL", avg_ms, "" if budget is None else " (budget %.3g ms)" % budget, a.output))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
