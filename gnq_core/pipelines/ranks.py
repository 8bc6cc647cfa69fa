"""Work split across the processes of ``torchrun --nproc-per-node N gnq ...``.

Every rank runs the same command.  Rank 0 (the lead) alone opens the store and decides what is
left to do; it hands that plan to the others, each rank computes its share (every N-th batch),
and the lead gathers the shares and writes the rows — the same rows one process would write.
Objects travel over a gloo group (CPU), whatever device the ranks compute on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Ranks:
        """This process's place under torchrun (WORLD_SIZE, RANK, LOCAL_RANK); one rank otherwise."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def lead(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """One GPU per rank on a multi-GPU machine (cuda:LOCAL_RANK)."""
        if self.world > 1 and device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank % max(torch.cuda.device_count(), 1))
        return device

    def share(self, n: int) -> list[int]:
        """This rank's indices of n work items (every world-th, starting at its rank)."""
        return list(range(self.rank, n, self.world))

    def broadcast(self, obj: T | None) -> T:
        """The lead's ``obj`` on every rank (an exception the lead raised is re-raised here)."""
        if self.world == 1:
            return obj  # type: ignore[return-value]
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        if isinstance(box[0], BaseException) and not self.lead:
            raise box[0]
        return box[0]  # type: ignore[return-value]

    def finish(self) -> None:
        """Every rank waits for the others, then leaves the group: a rank that simply exited while
        the lead was still writing could abort in gloo's teardown (SIGABRT, seen once in CI),
        and torchrun then stops the lead mid-write."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on the lead ([] elsewhere)."""
        if self.world == 1:
            return [obj]
        out: Sequence[Any] | None = [None] * self.world if self.lead else None
        dist.gather_object(obj, out, dst=0)
        return list(out) if out is not None else []
