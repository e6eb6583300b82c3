"""`edgekit finetune`: label-free distillation with INT8 fake quantization in the loop (one process or torchrun)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli.common import ShapeOpt, app, console, err


@app.command()
def finetune(
    model: Annotated[str, typer.Argument(help="float model: .pt2, .onnx, .keras/.h5, pkg.module:factory, or a pickled module (--trust-pickle)")],
    data: Annotated[str, typer.Option("--data", "-d", help="unlabeled inputs: a .npz (e.g. the --calib file) or a folder of .npy files")],
    out: Annotated[Path, typer.Option("--output", "-o", help="the fine-tuned model, *.pt2 (convert takes it)")],
    target: Annotated[str, typer.Option("--target", "-t", help="whose INT8 the student imitates: jetson | android")] = "jetson",
    epochs: Annotated[int, typer.Option("--epochs", help="passes over the data")] = 10,
    batch_size: Annotated[int, typer.Option("--batch-size", help="global batch (split over torchrun's processes)")] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Adam learning rate (cosine schedule to 0)")] = 1e-4,
    temperature: Annotated[float, typer.Option("--temperature", help="distillation temperature for class outputs")] = 4.0,
    class_loss: Annotated[str, typer.Option("--class-loss", help="loss on class outputs: kl (at --temperature) | mse (squared difference of the probabilities; weighs the near ties)")] = "kl",
    feature_weight: Annotated[float, typer.Option("--feature-weight", help="weight of the MSE on quantized intermediate activations (0: outputs only)")] = 0.0,
    learn_ranges: Annotated[bool, typer.Option("--learn-ranges/--hold-ranges", help="train the activation scales with the weights (LSQ), from min/max; jetson's convert --option student_ranges=on imposes them")] = False,
    prune: Annotated[float, typer.Option("--prune", help="also remove this share of channels (torch-pruning; pkg.module:factory models)")] = 0.0,
    amp: Annotated[bool, typer.Option("--amp/--no-amp", help="mixed precision: bf16 autocast on CPU, fp16 with a grad scaler on CUDA")] = False,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="write a checkpoint every N steps (0: only at the end)")] = 0,
    checkpoint_dir: Annotated[Path | None, typer.Option("--checkpoint-dir", help="checkpoint folder (default <output>.ckpt/)")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="continue from a checkpoint (same model, data and options)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the data order (and of the --holdout draw)")] = 0,
    holdout: Annotated[float, typer.Option("--holdout", help="share of the data kept out of training to check it generalises (e.g. 0.2)")] = 0.0,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda")] = "auto",
    input_shape: ShapeOpt = None,
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle", help="allow torch.load of a pickled module (runs code from the file)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Distill MODEL into an INT8 fake-quant student on unlabeled inputs; write its weights for `edgekit convert`.
    Runs the same under `torchrun --nproc-per-node N -m edgekit finetune ...` (DistributedDataParallel)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from edgekit.finetune import finetune as run, holdout_line, result_json

    rank0 = os.environ.get("RANK", "0") == "0"
    progress = Progress(TextColumn("finetune"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                        TimeRemainingColumn(), console=err, disable=not rank0 or as_json)
    task = progress.add_task("finetune", total=None, loss="—")

    def on_step(step: int, total: int, loss: float) -> None:
        progress.start()  # at the first step: checks and loading show no empty bar
        progress.update(task, completed=step, total=total, loss=f"{loss:.4g}")

    try:
        res = run(model, data, out, target=target, epochs=epochs, batch_size=batch_size, lr=lr, temperature=temperature,
                  class_loss=class_loss, feature_weight=feature_weight, learn_ranges=learn_ranges, prune=prune, amp=amp,
                  checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir, resume=resume, seed=seed,
                  holdout=holdout, device=device, input_shape=input_shape, trust_pickle=trust_pickle, on_step=on_step,
                  log=lambda m: rank0 and err.print(f"  [dim]{m}[/]", highlight=False))
    finally:
        progress.stop()
    if not rank0:
        return
    if as_json:
        print(json.dumps(result_json(res), indent=2))
        return
    agree = "" if res.agreement_after is None else (
        f", top-1 agreement with float {res.agreement_before:.1%} → {res.agreement_after:.1%}")
    console.print(f"distillation loss (int8 fake-quant vs float, all {res.record['recipe']['samples']} training "
                  f"inputs) {res.loss_before:.4g} → {res.loss_after:.4g}{agree}")
    if res.holdout:
        console.print(holdout_line(res.holdout))
    console.print(f"{res.steps} steps, {res.epochs} epochs on {res.world_size} process(es)"
                  f"{', AMP ' + res.amp if res.amp else ''}: {res.seconds:.1f} s ({res.seconds_per_epoch:.2f} s/epoch)")
    if res.checkpoints:
        console.print(f"checkpoints: {res.checkpoints[-1].parent}/ (last {res.checkpoints[-1].name})")
    calib = data if data.endswith(".npz") else "CALIB.npz"
    console.print(f"[bold green]fine-tuned[/] → {res.out}   next: edgekit convert {res.out} --target {target} "
                  f"--precision int8 --calib {calib}"
                  + (" --option student_ranges=on" if learn_ranges and target == "jetson" else ""))
