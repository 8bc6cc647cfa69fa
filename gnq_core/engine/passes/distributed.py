"""In-run GNQ under torch.distributed (DDP): the batch of the GNQ is a rank's micro-batch or the
global batch of all ranks.

    model = DDP(model)                                   # or FSDP: see docs/fsdp.md
    with GNQAuditor(model, lam=1e-2, scope="global") as auditor:   # DistributedGNQAuditor
        losses = per_example_lm_loss(model(**batch).logits, batch["labels"])
        losses.mean().backward()                         # DDP all-reduces gradients as usual
        res = auditor.compute(weights=torch.full((B,), 1 / B))   # this rank's own weights
        res.gnq                    # float64 [B_global], every rank the same numbers
        res.local_gnq              # this rank's rows: res.gnq[res.offset : res.offset + B]
        res.comm.bytes_sent        # what this rank handed to all_gather for this batch

**What the batch of the GNQ is.**  ``scope="rank"``: the examples of this rank's micro-batch
(B_r of them); GNQ_j = g_jᵀ (Σ_{k≠j in the micro-batch} g_k g_kᵀ + λI)⁻¹ g_j; no communication.
``scope="global"``: the concatenation, in rank order, of the micro-batches of all ranks that
ran this forward/backward together (B = Σ_r B_r); exactly the GNQ a single process would get
on that concatenated batch.  With gradient accumulation, each forward/backward is one GNQ
batch (per micro-batch, the default everywhere): the micro-batches of one optimizer step are
not pooled.  g_j is always the gradient of example j's own loss ℓ_j (DESIGN.md §1).

**Weights.**  The hooks see the output gradients of the objective *this rank* backpropagates,
before DDP averages parameter gradients over ranks; so ``compute(weights=...)`` takes this
rank's own w_j (1/B_r for a local mean, not 1/(B_r·world)).  The ranks' weights are gathered
and K is unweighted to the ℓ_j, so the global GNQ does not depend on how the ranks scale their
losses.

**How the global K is formed.**  K over the global batch is Σ over layers of ⟨g_j, g_k⟩ with
j, k on any rank.  Each layer's contribution is a representation of its per-example gradients
(``engine.math.representations``): factors (the layer's input X and output gradient Δ, or token
ids) or explicit per-example gradients.  When a layer's contribution is ready in the backward, every rank
all-gathers it and adds its *rows* K[j ∈ rank, all k] — the B_r × B block against each rank,
by the usual ghost/materialise cost model — then drops what it gathered.  Per layer the cost
model picks what to send: the factors (B·T·(d_in + d_out) numbers) or the per-example
gradients (B·d_in·d_out), whichever is fewer bytes over all ranks (``strategy="auto"``; force
one with "factors" / "gradients").  At ``compute()`` the B_r × B row blocks are gathered (B²
numbers) and every rank solves the same B × B system.

Communication runs on a process group of its own (created at construction, so every rank must
construct the auditor), never on the one DDP all-reduces on, and every rank issues the same
gathers in the same order (the backward visits the layers in the same order everywhere); a
structure mismatch between ranks is reported, not silently mixed.  The gathers are blocking,
inside the backward: they cost time, never gradients — ``param.grad`` is bitwise unchanged.
The fused path (``fused=True``) forms its Gram inside autograd and cannot be global.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn

from gnq_core.engine.math.representations import (
    DEFAULT_MEMORY_BUDGET,
    DenseFactor,
    DenseRep,
    OneHotFactor,
    OuterRep,
    Rep,
    compute_dtype,
    dense_values,
)
from gnq_core.engine.math.solve import LAM_ABSOLUTE, unweight_kernel
from gnq_core.engine.passes.micro import GNQResult, MicroAuditor
from gnq_core.engine.plan.batch import BatchDimensionError
from gnq_core.engine.plan.compiled import check_not_compiled

__all__ = ["Comm", "CommStats", "DistributedGNQAuditor", "DistributedGNQResult", "OwnComm", "RankRows",
           "Scope", "Strategy", "exchange_layout", "gather_factors", "unwrap_model"]

Scope = Literal["rank", "global"]
Strategy = Literal["auto", "factors", "gradients"]

_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32]
_MAX_DIMS = 3


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / DataParallel / FSDP(1) wrappers."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module) and type(model).__name__ in (
            "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
        model = model.module
    return model


@dataclass
class CommStats:
    """Bytes this rank exchanged for one GNQ batch (all_gather: it sends its part, receives the
    others'; padding to the largest rank's shape included, as it is really sent)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    gathers: int = 0
    by_kind: Counter = field(default_factory=Counter)  # factors / gradients / kernel / meta: sent
    layers: Counter = field(default_factory=Counter)  # contributions sent as factors / gradients

    def add(self, kind: str, sent: int, world: int) -> None:
        self.bytes_sent += sent
        self.bytes_received += sent * (world - 1)
        self.gathers += 1
        self.by_kind[kind] += sent


@dataclass
class RankRows:
    """Where this rank's examples stand in a result over the examples of all ranks."""

    rank: int = 0
    world_size: int = 1
    offset: int = 0  # this rank's examples are gnq[offset : offset + local_size]
    local_size: int = 0
    sizes: list[int] = field(default_factory=list)  # examples of every rank (its micro-batch or window)
    comm: CommStats = field(default_factory=CommStats)

    @property
    def local(self) -> slice:
        return slice(self.offset, self.offset + self.local_size)

    @property
    def local_gnq(self) -> torch.Tensor | None:
        """GNQ of this rank's own examples, in their order (None: no GNQ, a window of < 2 texts)."""
        gnq = self.gnq  # type: ignore[attr-defined]
        return None if gnq is None else gnq[self.local]


class OwnComm:
    """An auditor that communicates on a process group of its own (``self._comm``)."""

    _comm: Comm

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        self._comm.close()


@dataclass
class DistributedGNQResult(RankRows, GNQResult):
    scope: str = "rank"


class DistributedGNQAuditor(OwnComm, MicroAuditor):
    """``GNQAuditor`` for a model trained with torch.distributed (see the module doc).

    Other arguments as ``GNQAuditor``.

    Args:
        model: the model, wrapped in DDP or not (hooks go on the inner module).
        scope: "rank" (the rank's micro-batch) or "global" (all ranks' micro-batches).
        strategy: what the global scope gathers per layer: "auto" (fewer bytes), "factors",
            "gradients".
        group: the process group whose ranks form the global batch (default: all ranks); the
            auditor communicates on a new group with the same ranks.
    """

    def __init__(self, model: nn.Module, lam: float = 1e-2, *, scope: Scope = "global",
                 strategy: Strategy = "auto", group: Any = None,
                 path: Literal["auto", "ghost", "materialize"] = "auto",
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, check_uses: bool = True,
                 fused: bool | None = None, lam_mode: str = LAM_ABSOLUTE) -> None:
        if scope not in ("rank", "global"):
            raise ValueError(f"scope must be 'rank' or 'global', got {scope!r}")
        if strategy not in ("auto", "factors", "gradients"):
            raise ValueError(f"strategy must be 'auto', 'factors' or 'gradients', got {strategy!r}")
        if fused is None:  # the fastest exact path where it applies
            fused = scope == "rank"
        if scope == "global" and fused:
            raise ValueError("fused=True forms each layer's Gram inside autograd, on the rank's own "
                             "examples only; use scope='rank' or fused=False")
        check_not_compiled(model)  # before any process group or hook is made
        self.scope = scope
        self.strategy = strategy
        self._comm = Comm.create(group) if scope == "global" else Comm.single()
        self._sizes: list[int] = []
        super().__init__(unwrap_model(model), lam, path=path, memory_budget=memory_budget,
                         check_uses=check_uses, fused=fused, lam_mode=lam_mode)

    @property
    def _global(self) -> bool:
        return self.scope == "global" and self._comm.world > 1

    # ------------------------------------------------------------------ extension points
    def on_pass_start(self, batch_size: int) -> None:
        self._comm.stats = CommStats()

    def gram_block(self, rep: Rep) -> tuple[torch.Tensor, str]:
        if not self._global:
            return super().gram_block(rep)
        local, remote = self._gather(rep)
        own, path = self.pair_gram(local, local)
        blocks = [own if r == self.rank else self.pair_gram(local, other)[0]
                  for r, other in enumerate(remote)]
        return torch.cat(blocks, dim=1), path

    def cross_block(self, a: Rep, b: Rep) -> torch.Tensor:
        if not self._global:
            return super().cross_block(a, b)
        a_local, a_all = self._gather(a)
        b_local, b_all = self._gather(b)
        blocks = []
        for r in range(self.world_size):
            ab = self.pair_gram(a_local, b_all[r])[0]
            ba = self.pair_gram(b_local, a_all[r])[0]
            blocks.append(ab + ba)
        return torch.cat(blocks, dim=1)

    def merge_rows(self, rows: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
        """A tied weight's rows still needed by any rank (the union of their token rows)."""
        if not self._global:
            return rows
        mine = rows if rows is not None else torch.zeros(0, dtype=torch.long, device=device)
        flag = torch.tensor([int(rows is not None)], dtype=torch.long, device=device)
        flags = self._comm.gather(flag, "meta")
        if not all(int(f) for f in flags):  # some rank keeps the rows whole: so must all
            return None
        return torch.sort(torch.cat([t.to(mine.device) for t in self._comm.gather(mine, "meta")])).values

    def batch_kernel(self, kernel: torch.Tensor | None, batch_size: int, weights: torch.Tensor | None
                     ) -> tuple[torch.Tensor, int]:
        if not self._global:
            self._sizes = [batch_size]
            return super().batch_kernel(kernel, batch_size, weights)
        B = batch_size
        device = kernel.device if kernel is not None else None
        head = torch.tensor([B, int(weights is not None)], dtype=torch.long, device=device)
        heads = self._comm.gather(head, "meta")
        self._sizes = sizes = [int(h[0]) for h in heads]
        if len({int(h[1]) for h in heads}) != 1:
            raise ValueError("compute(weights=...) was given weights on some ranks but not on others")
        total = sum(sizes)
        rows = kernel if kernel is not None else torch.zeros(B, total, dtype=torch.float64,
                                                                    device=device)
        if rows.shape != (B, total):
            raise BatchDimensionError(f"kernel rows have shape {tuple(rows.shape)}; expected "
                                      f"({B}, {total}) for micro-batches of {sizes}")
        K = torch.cat(self._comm.gather(rows, "kernel"), dim=0)
        if weights is not None:
            w = weights.detach().reshape(-1).to(device=rows.device, dtype=torch.float64)
            if w.shape[0] != B:
                raise ValueError(f"weights has {w.shape[0]} entries but this rank's batch has {B}")
            K = unweight_kernel(K, torch.cat(self._comm.gather(w, "kernel")))
        return K, total

    # ------------------------------------------------------------------ gathering
    def _gather(self, rep: Rep) -> tuple[Rep, list[Rep]]:
        """All ranks' versions of one contribution, sent as factors or as gradients."""
        parts, structure, metas = exchange_layout(self._comm, rep)
        shapes = [_shapes(m, len(parts)) for m in metas]
        mode = self._choose(parts, shapes, rep, metas)
        self._comm.stats.layers[mode] += 1
        if mode == "gradients":
            local: Rep = DenseRep(rep.materialize()) if isinstance(rep, OuterRep) else rep
            G = local.G  # type: ignore[union-attr]
            gathered = self._comm.gather(G, "gradients", [(s[0][0], G.shape[1]) for s in shapes])
            return local, [DenseRep(g) for g in gathered]
        return rep, gather_factors(self._comm, parts, structure, metas)

    def _choose(self, parts: list[torch.Tensor], shapes: list[list[tuple[int, ...]]], rep: Rep,
                metas: list[list[int]]) -> str:
        if isinstance(rep, DenseRep) or self.strategy == "factors":
            return "factors"
        if self.strategy == "gradients":
            return "gradients"
        world = self.world_size
        factor_bytes = sum(world * math.prod(max(s[i] for s in shapes)) * t.element_size()
                           for i, t in enumerate(parts))
        batch = max(s[0][0] for s in shapes)
        grad_bytes = world * batch * rep.numel * compute_dtype(dense_values(rep)).itemsize
        return "factors" if factor_bytes <= grad_bytes else "gradients"

    def compute(self, weights: torch.Tensor | None = None) -> DistributedGNQResult:
        res = super().compute(weights)
        sizes = self._sizes
        offset = sum(sizes[: self.rank]) if self._global else 0
        local = sizes[self.rank] if self._global else res.batch_size
        return DistributedGNQResult(**vars(res), scope=self.scope, rank=self.rank,
                                    world_size=self.world_size, offset=offset, local_size=local,
                                    sizes=list(sizes), comm=self._comm.stats)


# ---------------------------------------------------------------------- gathering reps
def exchange_layout(comm: Comm, rep: Rep) -> tuple[list[torch.Tensor], tuple, list[list[int]]]:
    """``rep``'s tensors, its structure and every rank's layout of it (kind, dtypes, shapes);
    raises when the ranks hold different layers (or widths) at this point."""
    parts, structure = _flatten(rep)
    meta = torch.tensor(_meta(parts, structure, rep), dtype=torch.long)
    metas = [m.tolist() for m in comm.gather(meta.to(parts[0].device), "meta")]
    if any(_signature(m) != _signature(metas[0]) for m in metas):
        raise RuntimeError("GNQAuditor(scope='global'): the ranks reached different layers (or layers of "
                           "different widths) at the same point of the backward; every rank must "
                           "run the same model on a batch of the same structure")
    return parts, structure, metas


def gather_factors(comm: Comm, parts: list[torch.Tensor], structure: tuple, metas: list[list[int]]
                   ) -> list[Rep]:
    """Every rank's version of one representation, from its factors (``exchange_layout`` first)."""
    shapes = [_shapes(m, len(parts)) for m in metas]
    columns = [comm.gather(t, "factors", [s[i] for s in shapes]) for i, t in enumerate(parts)]
    return [_unflatten([col[r] for col in columns], structure) for r in range(comm.world)]


# ---------------------------------------------------------------------- serialising reps
def _factor_parts(f: DenseFactor | OneHotFactor) -> tuple[torch.Tensor, tuple]:
    return (f.values, ("dense",)) if isinstance(f, DenseFactor) else (f.tokens, ("onehot", f.n))


def _flatten(rep: Rep) -> tuple[list[torch.Tensor], tuple]:
    if isinstance(rep, DenseRep):
        return [rep.G], ("dense-rep",)
    (a, sa), (c, sc) = _factor_parts(rep.A), _factor_parts(rep.C)
    return [a, c], ("outer", sa, sc, rep.bias)


def _unflatten(parts: list[torch.Tensor], structure: tuple) -> Rep:
    if structure[0] == "dense-rep":
        return DenseRep(parts[0])
    _, sa, sc, bias = structure

    def factor(t: torch.Tensor, s: tuple) -> DenseFactor | OneHotFactor:
        return DenseFactor(t) if s[0] == "dense" else OneHotFactor(t, s[1])

    return OuterRep(factor(parts[0], sa), factor(parts[1], sc), bias)


def _meta(parts: list[torch.Tensor], structure: tuple, rep: Rep) -> list[int]:
    """[kind codes..., per part: dtype, ndim, shape (padded)]: compared across ranks."""
    if structure[0] == "dense-rep":
        head = [0, 0, 0, 0, 0]
    else:
        _, sa, sc, bias = structure
        head = [1, int(sa[0] == "onehot"), sa[1] if sa[0] == "onehot" else 0,
                int(sc[0] == "onehot"), int(bias)]
    body = []
    for t in parts:
        if t.dim() > _MAX_DIMS:
            raise ValueError(f"cannot gather a {t.dim()}-dimensional factor")
        body += [_DTYPES.index(t.dtype), t.dim(), *t.shape, *([0] * (_MAX_DIMS - t.dim()))]
    return head + body


def _signature(meta: list[int]) -> list[int]:
    """Everything but the batch size and sequence length (which may differ between ranks)."""
    head, body = meta[:5], meta[5:]
    out = list(head)
    for i in range(0, len(body), 2 + _MAX_DIMS):
        dtype, ndim, *shape = body[i:i + 2 + _MAX_DIMS]
        trailing = shape[2:ndim] if head[0] == 1 else shape[1:ndim]  # factors [B, T, w]; G [B, n]
        out += [dtype, ndim, *trailing]
    return out


def _shapes(meta: list[int], n: int) -> list[tuple[int, ...]]:
    body = meta[5:]
    shapes = []
    for i in range(n):
        chunk = body[i * (2 + _MAX_DIMS):(i + 1) * (2 + _MAX_DIMS)]
        shapes.append(tuple(chunk[2:2 + chunk[1]]))
    return shapes


# ---------------------------------------------------------------------- communication
class Comm:
    """all_gather of tensors whose shapes differ between ranks: pad to the largest, trim after."""

    def __init__(self, group: Any, rank: int, world: int, owned: bool) -> None:
        self.group, self.rank, self.world, self._owned = group, rank, world, owned
        self.stats = CommStats()

    @classmethod
    def single(cls) -> Comm:
        return cls(None, 0, 1, False)

    @classmethod
    def create(cls, group: Any = None) -> Comm:
        if not (dist.is_available() and dist.is_initialized()):
            return cls.single()
        ranks = None if group is None else dist.get_process_group_ranks(group)
        own = dist.new_group(ranks=ranks)  # collective: every rank of the default group calls it
        return cls(own, dist.get_rank(own), dist.get_world_size(own), True)

    def gather(self, t: torch.Tensor, kind: str, shapes: list[tuple[int, ...]] | None = None
               ) -> list[torch.Tensor]:
        """Every rank's ``t``; ``shapes``: each rank's shape (default: exchanged first)."""
        if self.world == 1:
            return [t]
        t = t.contiguous()
        if shapes is None:
            if t.dim() > _MAX_DIMS:
                raise ValueError(f"cannot gather a {t.dim()}-dimensional tensor")
            dims = torch.tensor([*t.shape, *([0] * (_MAX_DIMS - t.dim()))], dtype=torch.long, device=t.device)
            dims_all = self._all_gather(dims, "meta")
            shapes = [tuple(int(x) for x in d[:t.dim()]) for d in dims_all]
        big = tuple(max(s[i] for s in shapes) for i in range(t.dim()))
        padded = t
        if tuple(t.shape) != big:
            padded = t.new_zeros(big)
            padded[tuple(slice(0, n) for n in t.shape)] = t
        out = self._all_gather(padded, kind)
        return [o[tuple(slice(0, n) for n in s)] for o, s in zip(out, shapes, strict=True)]

    def _all_gather(self, t: torch.Tensor, kind: str) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=self.group)
        self.stats.add(kind, t.nbytes, self.world)
        return out

    def close(self) -> None:
        if self._owned and self.group is not None:
            dist.destroy_process_group(self.group)
            self.group, self._owned = None, False
