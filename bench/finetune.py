"""`edgekit finetune` side by side: time per epoch without and with AMP, and one process against
`torchrun --nproc-per-node 2` (gloo), with the final loss of each; then what the fine-tuned weights give after
`convert -t jetson -p int8`, against the original float model on the held-out inputs.

    python bench/finetune.py [--epochs 10] [--rounds 3] [--threads 1]

Model and data: examples/digits (real scikit-learn digits). The AMP runs alternate with the fp32 ones
(``--rounds`` each) so that load on a shared machine falls on both; the table gives the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits"


def int8_vs_float(model: Path, out: Path) -> dict:
    import onnxruntime as ort
    import torch

    from edgekit.ingest import load_model
    from edgekit.pipeline import convert

    res = convert(str(model), target="jetson", out=out, precision="int8", calib=str(DIGITS / "calib.npz"),
                  fail_on_verification=False)
    with np.load(DIGITS / "eval.npz") as z:
        x, y = z["image"], z["label"]
    ref = load_model(DIGITS / "digits_cnn.pt2").torch_module
    with torch.no_grad():
        fl = np.concatenate([ref(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    sess = ort.InferenceSession(str(res.out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    q = np.concatenate([sess.run(None, {"image": x[i:i + 1]})[0] for i in range(len(x))])
    logp = lambda a: torch.log_softmax(torch.from_numpy(a).double(), 1)  # noqa: E731
    kl = float(torch.nn.functional.kl_div(logp(q), logp(fl), log_target=True, reduction="batchmean"))
    return {"agree": float(np.mean(q.argmax(1) == fl.argmax(1))), "acc": float(np.mean(q.argmax(1) == y)), "kl": kl}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (torchrun: OMP_NUM_THREADS)")
    args = ap.parse_args()
    import torch

    from edgekit.finetune import finetune

    torch.set_num_threads(args.threads)
    data, model = DIGITS / "calib.npz", DIGITS / "digits_cnn.pt2"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs: dict[str, list] = {"fp32": [], "bf16 AMP": []}
        for r in range(args.rounds):
            for name, amp in (("fp32", False), ("bf16 AMP", True)):
                runs[name].append(finetune(model, data, work / f"{name[:4]}-{r}.pt2", epochs=args.epochs, amp=amp))
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "edgekit", "finetune", str(model), "-d", str(data), "--epochs", str(args.epochs),
                            "--json", "-o", str(work / "two.pt2")], capture_output=True, text=True, env=env, check=True)
        two = json.loads(p.stdout)
        print(f"digits CNN, {args.epochs} epochs of {runs['fp32'][0].steps // args.epochs} steps (global batch 32), "
              f"{args.threads} thread(s) per process\n")
        print("| run | s/epoch (median) | final loss |\n|---|---|---|")
        base = statistics.median(r.seconds_per_epoch for r in runs["fp32"])
        for name, rs in runs.items():
            t = statistics.median(r.seconds_per_epoch for r in rs)
            print(f"| 1 process, {name} | {t:.4f} ({t / base:.2f}x) | {rs[0].loss_after:.10g} |")
        print(f"| torchrun 2 processes, fp32 | {two['seconds_per_epoch']:.4f} ({two['seconds_per_epoch'] / base:.2f}x) "
              f"| {two['loss_after']:.10g} |")
        one = runs["fp32"][0].loss_after
        print(f"\n1 vs 2 processes: relative difference of the final loss {abs(two['loss_after'] - one) / one:.2e}")
        plain = int8_vs_float(model, work / "b-plain")
        tuned = int8_vs_float(runs["fp32"][0].out, work / "b-ft")
        print("\njetson INT8 after convert vs the original float model, 450 held-out inputs\n")
        print("| weights | agreement | accuracy | KL(float‖int8) |\n|---|---|---|---|")
        for name, r in (("float model, plain PTQ", plain), ("after finetune", tuned)):
            print(f"| {name} | {r['agree']:.2%} | {r['acc']:.2%} | {r['kl']:.3g} |")


if __name__ == "__main__":
    main()
