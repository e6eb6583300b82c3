"""What a run writes: checkpoints that resume it exactly (weights, optimizer, schedule, step, RNG), and the
fine-tuned model itself, a ``.pt2`` with its lineage record inside (edgekit.lineage), written atomically."""

from __future__ import annotations

import copy
import json
import os
import warnings
import zipfile
from pathlib import Path
from typing import Any

from edgekit.deps import require
from edgekit.errors import InputSpecError, OutputError
from edgekit.fakequant import set_mode
from edgekit.ingest import Model
from edgekit.lineage import RECORD

CKPT_FORMAT = 1


def check_out(out: Path) -> None:
    """``out`` may be written: it does not exist, or it is a .pt2 that finetune wrote (its record inside)."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_file() and not out.is_symlink() and zipfile.is_zipfile(out):
        with zipfile.ZipFile(out) as zf:
            if any(n.endswith("/extra/" + RECORD) or n == "extra/" + RECORD for n in zf.namelist()):
                return
    raise OutputError(f"{out} exists and is not a model edgekit finetune wrote; choose another -o")


def write_model(net, model: Model, out: Path, record: dict[str, Any]) -> Path:
    """The student with fake quantization off, exported as a .pt2 with the recipe inside; written atomically."""
    torch = require("torch")
    import tempfile

    from edgekit.fsutil import file_mode

    feeds = model.example_feeds()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        net = copy.deepcopy(net).cpu().eval()
        set_mode(net, "off")
        for p in net.parameters():
            p.requires_grad_(False)
        ep = torch.export.export(net, tuple(torch.from_numpy(feeds[s.name]) for s in model.inputs))
    out.parent.mkdir(parents=True, exist_ok=True)
    check_out(out)  # again: something may have appeared there while it trained
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", suffix=".pt2", dir=out.parent)
    os.close(fd)
    try:
        torch.export.save(ep, tmp, extra_files={RECORD: json.dumps(record, indent=2)})
        os.chmod(tmp, file_mode())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def save_checkpoint(folder: Path, step: int, student, opt, sched, scaler, recipe: dict[str, Any]) -> Path:
    torch = require("torch")
    import io

    from edgekit.fsutil import atomic_write_bytes

    buf = io.BytesIO()
    torch.save({"format": CKPT_FORMAT, "step": step, "recipe": recipe, "student": student.net.state_dict(),
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "scaler": scaler.state_dict(),
                "rng_cpu": torch.get_rng_state()}, buf)
    dest = folder / f"step-{step:07d}.pt"
    atomic_write_bytes(dest, buf.getvalue())
    return dest


def load_checkpoint(path: Path) -> dict[str, Any]:
    torch = require("torch")
    if not path.is_file():
        raise InputSpecError(f"--resume {path}: no such checkpoint file")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)  # tensors and plain values only
    except Exception as exc:  # noqa: BLE001 - torch raises many types for damaged or foreign files
        raise InputSpecError(f"--resume {path}: not a finetune checkpoint ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    if not isinstance(state, dict) or state.get("format") != CKPT_FORMAT:
        raise InputSpecError(f"--resume {path}: not a checkpoint written by edgekit finetune")
    return state


def check_resume(state: dict[str, Any], recipe: dict[str, Any], path: Path) -> None:
    diff = [f"{k} {state['recipe'].get(k)!r} -> {v!r}" for k, v in recipe.items()
            if state["recipe"].get(k) != v and k != "data"]  # the data by content: a path may be written otherwise
    if diff:
        raise InputSpecError(f"--resume {path}: the checkpoint was made with other settings ({'; '.join(diff)}); "
                             "resume with the same model, data and options")


def restore(state: dict[str, Any], student, opt, sched, scaler) -> int:
    """A checkpoint's weights, optimizer, schedule, scaler and CPU RNG put back; returns its step."""
    torch = require("torch")
    student.net.load_state_dict(state["student"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng_cpu"])
    return int(state["step"])
