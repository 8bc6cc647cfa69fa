"""``gnq audit --shard-model`` under torchrun: each checkpoint sharded over the ranks with FSDP2.

Every transformer block is its own ``fully_shard`` unit, then the root (the embeddings, the final
norm, the head), so each rank holds 1/N of the parameters; a unit's full weights exist only
while it runs forward or backward (FSDP2 all-gathers them then and frees them after).  The
auditor needs nothing else: its hooks see the activations and output gradients of the rank's
own batch, and the generic per-example kernel runs inside the unit's backward, when its weights
are gathered (docs/fsdp.md).  Each batch is still audited by one rank against its own batch, so
its GNQ is the one process's; what the ranks share is the weights, which is why every rank must
take part in every forward and backward (``lockstep``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gnq_core.pipelines.ranks import Ranks

SHARD_OPTION = "--shard-model"


def check_shardable(world: int | None = None, *, companions: object = None, adapters: bool = False) -> None:
    """One line when the sharded audit cannot run: it shards over the processes of torchrun
    (``world``; None: not known yet), and audits each batch against its own texts (the per-batch
    audit, whose post-hoc pass is unfused) of a plain checkpoint."""
    if companions is not None:
        raise ValueError(f"{SHARD_OPTION} shards the per-batch audit: --companions (each text against "
                         f"the others' sketches) is not sharded yet; run it without {SHARD_OPTION}")
    if adapters:
        raise ValueError(f"{SHARD_OPTION} shards a plain checkpoint: PEFT adapters (--base-model) are not "
                         f"sharded yet; run them without {SHARD_OPTION}")
    if world is not None and world <= 1:
        raise ValueError(f"{SHARD_OPTION} shards the model over the processes of torchrun: run it as "
                         f"`torchrun --nproc-per-node N gnq audit {SHARD_OPTION} ...` with N ≥ 2, or without "
                         f"{SHARD_OPTION} in one process")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, each a unit of its own: the modules of the classes the model
    names as never to be split (transformers' ``_no_split_modules``: GPT2Block, LlamaDecoderLayer,
    ...), else the modules of the longest ModuleList (a decoder's layer list).  Outermost only."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not found:
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1]
        found = list(max(lists, key=len)) if lists else []
    inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
    return [m for m in found if id(m) not in inner]


def device_mesh(ranks: Ranks, device: torch.device):
    """The 1-D mesh of all ranks the shards live on: the gloo world group on CPU; on CUDA an NCCL
    group of the same ranks (gloo cannot all-gather CUDA tensors; the world group stays gloo, for
    the plan and the gathered rows).  Every rank must call this, in the same order."""
    from torch.distributed.device_mesh import DeviceMesh

    if device.type == "cuda":
        torch.cuda.set_device(device)
        return DeviceMesh.from_group(dist.new_group(backend="nccl"), "cuda")
    if device.type != "cpu":
        raise ValueError(f"{SHARD_OPTION} runs on CPU (gloo) or CUDA (NCCL), not on {device.type}")
    return DeviceMesh.from_group(dist.group.WORLD, "cpu")


def shard(model: nn.Module, mesh) -> int:
    """Shard ``model`` in place: every transformer block, then the root; returns the number of
    blocks.  A model without repeated blocks is refused: the root alone would gather every weight
    at once, no less memory than the whole model."""
    from torch.distributed.fsdp import fully_shard

    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"{SHARD_OPTION}: found no transformer blocks to shard in "
                         f"{type(model).__name__} (neither _no_split_modules nor a layer list)")
    for block in blocks:  # one by one: a device holds its shards and at most one block in full
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    # The post-hoc backward differentiates only w.r.t. module outputs (MicroAuditor.backward): the
    # auditor needs activations and output gradients, never the parameters' gradients.  There are
    # normally none to reduce; with the sync off, one formed anyway (a graph without an input-end
    # module falls back to loss.backward()) is never reduce-scattered: no communication for
    # numbers the audit drops, and no collective a rank could join out of step.
    model.set_requires_gradient_sync(False)
    return len(blocks)


def local_numel(model: nn.Module) -> tuple[int, int]:
    """(parameters this rank holds, parameters of the model): a DTensor's local shard and its
    full size; a plain tensor counts whole in both."""
    held = total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        held += local.numel()
        total += p.numel()
    return held, total


def lockstep(mine: list[int], n_batches: int, world: int) -> list[int]:
    """The batches a sharded rank runs: its own, then copies of one of them (batch 0 for a rank
    with none) until every rank runs ceil(n_batches / world) — each forward and backward
    all-gathers every unit's weights from all ranks, so a rank with no batch left still takes
    part.  The copies' rows are dropped (``audit_batches(padding=...)``)."""
    rounds = -(-n_batches // world)
    return mine + [mine[-1] if mine else 0] * (rounds - len(mine))
