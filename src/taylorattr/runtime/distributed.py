"""Run on one process or under ``torchrun``: rank, world size, device, barrier, shutdown.

``torchrun --nproc-per-node N`` (and multi-node through its rendezvous) starts N copies
of a program with the environment variables ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. :func:`session` reads them and, when
``WORLD_SIZE > 1``, joins the process group (``gloo`` on CPU, ``nccl`` when CUDA is
available), each rank on its own device (``cuda:LOCAL_RANK``, else the CPU). Without
those variables it is a single process of rank 0 in a world of 1 and nothing is
initialised, so the same code runs both ways::

    with distributed.session() as ctx:
        for unit in units[ctx.rank::ctx.world_size]:
            ...
        ctx.barrier()
        if ctx.is_main:
            merge()

Leaving the block destroys the process group this module created (also on errors), so
no listening socket outlives the job.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

__all__ = ["Context", "broadcast_object", "env_world", "session"]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer (torchrun sets it), "
                         f"got {text!r}") from None


def env_world() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's variables; ``(0, 1, 0)`` without."""
    rank, world, local = (_env_int("RANK", 0), _env_int("WORLD_SIZE", 1),
                          _env_int("LOCAL_RANK", 0))
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ValueError(f"inconsistent torchrun environment: RANK={rank}, WORLD_SIZE={world}, "
                         f"LOCAL_RANK={local}; start the job with torchrun")
    return rank, world, local


@dataclass(frozen=True)
class Context:
    """Where this process stands: ``rank`` of ``world_size``, its ``device``."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None  # None: a single process, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    def barrier(self) -> None:
        """Wait for every rank (a no-op on one process)."""
        if self.distributed:
            import torch.distributed as dist

            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()


def broadcast_object(ctx: Context, obj=None, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank (pickled; for small control messages)."""
    if not ctx.distributed:
        return obj
    import torch.distributed as dist

    box = [obj if ctx.rank == src else None]
    dist.broadcast_object_list(box, src=src, device=ctx.device if ctx.backend == "nccl" else None)
    return box[0]


@contextlib.contextmanager
def session(device: str | torch.device | None = None, timeout_s: float = 1800.0
            ) -> Iterator[Context]:
    """The :class:`Context` of this process; joins and finally leaves the process group
    when torchrun started more than one process.

    ``device``: force a device (``"cpu"``); default ``cuda:LOCAL_RANK`` when CUDA is
    available, else the CPU. ``timeout_s`` bounds collective waits (a barrier whose peer
    died fails after it instead of hanging).
    """
    rank, world, local = env_world()
    if device is None:
        dev = torch.device(f"cuda:{local}") if torch.cuda.is_available() else torch.device("cpu")
    else:
        dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world == 1:
        yield Context(0, 1, local, dev, None)
        return
    import torch.distributed as dist

    if dist.is_initialized():  # the caller owns the group; use it, leave it
        yield Context(dist.get_rank(), dist.get_world_size(), local, dev, dist.get_backend())
        return
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ValueError(f"WORLD_SIZE={world} but {', '.join(missing)} is not set; start "
                         "the job with torchrun")
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield Context(rank, world, local, dev, backend)
    finally:
        dist.destroy_process_group()
