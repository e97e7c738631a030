"""Several processes under a launcher (`accelerate launch`, `torchrun`): this process's rank, the
collective operations the sampling and scoring tools need (gather results on the main process, wait
for each other), and nothing when the tool runs as one process.

Work is split by rank and gathered on rank 0, which alone writes; the launcher's environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) says how many processes there are.
"""

from __future__ import annotations

import functools
import os
from typing import Any


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def launched() -> bool:
    """More than one process takes part in this run."""
    return world_size() > 1


@functools.cache
def _object_group() -> Any:
    """A gloo group for Python objects (samples, scores): it works the same whether the training
    backend is NCCL on GPUs or gloo on CPUs, and needs no device placement for the objects."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if _cuda() else "gloo"
        dist.init_process_group(backend=backend, rank=rank(), world_size=world_size())
    return dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def gather(value: Any) -> list[Any] | None:
    """Every process's `value`, in rank order, on the main process (None elsewhere); [value] alone."""
    if not launched():
        return [value]
    import torch.distributed as dist

    group = _object_group()
    gathered: list[Any] | None = [None] * world_size() if is_main() else None
    dist.gather_object(value, gathered, dst=0, group=group)
    return gathered


def all_gather(value: Any) -> list[Any]:
    """Every process's `value`, in rank order, on every process; [value] alone."""
    return broadcast(gather(value))


def broadcast(value: Any) -> Any:
    """The main process's `value`, on every process."""
    if not launched():
        return value
    import torch.distributed as dist

    box = [value if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=_object_group())
    return box[0]


def barrier() -> None:
    """Wait until every process gets here (a later step reads what an earlier one wrote)."""
    if launched():
        import torch.distributed as dist

        dist.barrier(group=_object_group())
