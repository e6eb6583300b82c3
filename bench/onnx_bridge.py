"""The ONNX -> torch bridge on the zoo's ONNX models, side by side: onnx2torch 1.5.15 alone vs edgekit's bridge
(prepare + onnx2torch with edgekit's converters + torch.export). Prints, per model: whether each takes it (through
torch.export, which every torch converter needs), the bridge's time, and its largest difference from onnxruntime.

    EDGEKIT_ZOO_CACHE=/tmp/zoocache python bench/onnx_bridge.py
"""

from __future__ import annotations

import time

import numpy as np


def alone(path, m) -> str:
    """onnx2torch 1.5.15 by itself (its own converters only: run before edgekit registers any), on the file with
    the zoo's shapes and constants applied by edgekit's prepare (so only the translation is compared)."""
    import onnx
    import torch

    from edgekit._vendor import onnx2torch

    from edgekit.input_spec import parse_shapes
    from edgekit.onnx_prepare import parse_consts, prepare

    try:
        prep = prepare(path, onnx.load(str(path)), parse_shapes(m.input_shape), parse_consts(m.const))
        g = onnx2torch.convert(prep.proto).eval()
        torch.export.export(g, tuple(torch.zeros(s, dtype=getattr(torch, d)) for _, s, d in prep.inputs))
        return "yes"
    except Exception as exc:  # noqa: BLE001 - the column records how onnx2torch alone fails
        return type(exc).__name__[:24]


def main() -> None:
    import torch

    from edgekit.errors import EdgekitError
    from edgekit.ingest import load_model
    from edgekit.onnx_bridge import bridge_model
    from edgekit.zoo import catalog, fetch

    models = [(m, fetch(m)) for m in catalog() if not m.factory]
    first = {m.name: alone(p, m) for m, p in models}  # before edgekit's converters are registered
    print(f"{'model':16} {'onnx2torch alone':24} {'edgekit bridge':28} {'bridge s':>8} {'max |diff| vs ORT':>18}")
    n_bridge = 0
    for m, path in models:
        t0 = time.perf_counter()
        try:
            model = load_model(path, m.input_shape or None, consts=m.const or None)
            b = bridge_model(model, str(path))
            dt = time.perf_counter() - t0
            rng = np.random.default_rng(3)
            feeds = {s.name: rng.random(s.shape).astype(s.dtype) for s in model.inputs}
            want = model.reference()(feeds)
            with torch.no_grad():
                got = b.exported.module()(*[torch.from_numpy(feeds[s.name]) for s in model.inputs])
            got = got if isinstance(got, (list, tuple)) else [got]
            diff = max(float(np.max(np.abs(g.numpy() - w))) for g, w in zip(got, want, strict=True))
            verdict, n_bridge = "yes", n_bridge + 1
        except EdgekitError as exc:
            dt, diff = time.perf_counter() - t0, float("nan")
            verdict = "refused: " + str(exc).split(": ", 1)[1][:18]
        print(f"{m.name:16} {first[m.name]:24} {verdict:28} {dt:8.2f} {diff:18.2e}")
    print(f"\nonnx2torch alone: {sum(v == 'yes' for v in first.values())}/{len(models)} models through torch.export; "
          f"edgekit's bridge: {n_bridge}/{len(models)}")


if __name__ == "__main__":
    main()
