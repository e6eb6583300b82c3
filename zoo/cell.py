"""One conformance cell, run in its own process by edgekit.zoo.run: convert one zoo model for one target and
precision, print one JSON line (``ZOO-CELL {...}``). Refusals and failures edgekit reports are results; an
exception edgekit does not turn into a one-line error propagates (the run records it as a traceback)."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from edgekit.errors import EdgekitError, HostCannotError, ProfileError, UnsupportedInputError, UnsupportedOpError
    from edgekit.pipeline import convert

    t0 = time.perf_counter()
    out: dict = {"status": None}
    try:
        res = convert(spec["model"], target=spec["target"], precision=spec["precision"], out=spec["out"],
                      calib=spec["data"], eval_data=spec["data"], input_shape=spec["input_shape"] or None,
                      consts=spec["const"] or None, output_kinds=spec["output_kinds"] or None,
                      batch_axes=spec.get("batch_axis") or None, carries=spec.get("carry") or None,
                      sequence_length=spec.get("sequence_length"), fail_on_verification=False,
                      cache=spec.get("cache", True),
                      **({"golden_count": spec["golden"]} if spec.get("golden") else {}))
        v = res.verification
        man = res.manifest
        prim = man["artifact"]["primary"]
        out.update(
            status="pass" if v.passed else "failed",
            reason=None if v.passed else "; ".join(v.failures)[:400],
            outputs=[{"name": o.name, "kind": o.kind, "max_rel_error": o.max_rel_error, "tolerance": o.tolerance_rel,
                      "top1_agreement": o.top1_agreement, **o.metrics, "passed": o.passed} for o in v.outputs],
            eval_samples=v.eval_samples, eval_agreement=v.eval_agreement,
            artifact_bytes=sum(f["bytes"] for k, f in man["files"].items() if k == prim or k.startswith(prim + "/")),
            runtime=v.runtime, timings_s=res.timings_s, warnings=len(res.warnings),
            bridge=man["source_model"].get("bridge"), carried=v.carried,
        )
    except EdgekitError as exc:
        refused = isinstance(exc, (UnsupportedOpError, UnsupportedInputError, ProfileError, HostCannotError))
        out.update(status="refused" if refused else "failed", error=type(exc).__name__, reason=str(exc)[:600])
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print("ZOO-CELL " + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
