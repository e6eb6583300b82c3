"""One process or many: the process group ``torchrun`` describes in the environment (gloo on CPU, nccl on CUDA),
the student wrapped in DistributedDataParallel, and what the processes agree on (the loss shown, the end)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from edgekit.deps import require
from edgekit.errors import InputSpecError


@dataclass(frozen=True)
class Launch:
    rank: int
    world: int
    device: Any  # torch.device
    initialized_here: bool  # the process group was started here, and is ended here


def dist_setup(device: str | None) -> Launch:
    """The rank, world size and device from torchrun's environment; one process when absent."""
    torch = require("torch")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available() if device in (None, "auto") else device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise InputSpecError("--device cuda: torch sees no CUDA device here (a CPU build of torch, or no GPU); "
                             "use --device cpu")
    if world <= 1:
        return Launch(0, 1, torch.device("cuda" if cuda else "cpu"), False)
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    here = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
        here = True
    return Launch(dist.get_rank(), dist.get_world_size(), dev, here)


def ddp(student, launch: Launch):
    """The module a training step calls: the student itself on one process, else DistributedDataParallel of it
    (buffers are not synchronised: the held activation ranges are alike on every rank)."""
    if launch.world <= 1:
        return student
    torch = require("torch")
    dev = launch.device
    return torch.nn.parallel.DistributedDataParallel(student, device_ids=[dev.index] if dev.type == "cuda" else None,
                                                     forward_sync_buffers=False)


def mean_over_ranks(value, launch: Launch):
    """A per-rank scalar tensor averaged over the processes (in place), as progress shows it."""
    if launch.world > 1:
        torch = require("torch")
        torch.distributed.all_reduce(value)
        value /= launch.world
    return value


def barrier(launch: Launch) -> None:
    if launch.world > 1:
        require("torch").distributed.barrier()


def teardown(launch: Launch) -> None:
    if launch.initialized_here:
        require("torch").distributed.destroy_process_group()
