"""`edgekit finetune` on a graph traced at batch 1: whole batches (its reshapes to batch 1 rewritten to follow the
batch, checked against one sample at a time) against one sample at a time inside each batch (the rewrite off), side
by side in one run, with the final loss of each.

    python bench/finetune_batch.py [--epochs 2] [--rounds 2] [--threads 1] [--batch-size 32]

Model and data: the zoo's ppocr-cls (ONNX, rebuilt in torch by the onnx2torch bridge at x:1,3,48,192; onnxslim folds
its flatten to [1, 200]) on the zoo's 160 text lines, jetson fake quantization. The arms alternate (``--rounds``
each, round r with seed r) so that load on a shared machine falls on both; the table gives the median seconds per
epoch and each run's final loss.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    import torch

    import edgekit.finetune as F
    import edgekit.finetune.student as S  # where the student build looks free_batch up
    from edgekit.zoo import fetch, select
    from edgekit.zoo.run import prepare_data

    torch.set_num_threads(args.threads)
    m = select(["ppocr-cls"])[0]
    model, data = str(fetch(m)), str(prepare_data(m))
    rewrite = S.free_batch
    arms = {"whole batches (reshape rewritten)": rewrite, "one sample at a time": lambda gm: 0}
    runs: dict[str, list] = {k: [] for k in arms}
    said: dict[str, list[str]] = {k: [] for k in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, free in arms.items():
                S.free_batch = free
                try:
                    runs[name].append(F.finetune(model, data, Path(tmp) / f"{r}-{len(runs[name])}-{name[:5]}.pt2",
                                                 target="jetson", epochs=args.epochs, batch_size=args.batch_size,
                                                 seed=r,
                                                 input_shape=list(m.input_shape), log=said[name].append))
                finally:
                    S.free_batch = rewrite
    first = next(iter(runs.values()))[0]
    print(f"ppocr-cls (zoo), jetson, {args.epochs} epochs of {first.steps // args.epochs} steps (batch "
          f"{args.batch_size}), {args.threads} thread(s)\n")
    print("| run | s/epoch (median) | final loss, seed 0, 1, ... | what finetune said |\n|---|---|---|---|")
    base = statistics.median(r.seconds_per_epoch for r in runs["one sample at a time"])
    for name, rs in runs.items():
        t = statistics.median(r.seconds_per_epoch for r in rs)
        note = next((s for s in said[name] if "batch 1" in s), "")
        print(f"| {name} | {t:.2f} ({t / base:.2f}x) | {', '.join(f'{r.loss_after:.4g}' for r in rs)} | {note} |")
    print("\nThe arms compute the same sums in another order (a batched convolution against one per sample): values "
          "at a rounding boundary of the fake quantization then round the other way, so the two differ as two seeds "
          "(the data order, round r runs seed r) do, not by a fixed amount.")


if __name__ == "__main__":
    main()
