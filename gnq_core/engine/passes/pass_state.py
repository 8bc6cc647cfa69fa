"""One audited forward/backward's bookkeeping: which calls used which parameter, and K so far.

The auditor (``engine.auditor``) opens a ``PassState`` per forward; each covered call reports its
Gram contributions here once its output gradients have arrived.  Narrow per-example gradients
are kept for one joint Gram, norm layers' factors for one stacked computation at ``compute()``
(``engine.kernels.deferred``), fused layers add into per-dtype accumulators, and a parameter used by
several calls gets its cross terms (``PassState.add_cross_terms``).  Every Gram block goes through the
auditor's extension points (``engine.passes.extension_points``), so a subclass can change what the batch is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gnq_core.engine.kernels import Contribution
from gnq_core.engine.kernels.deferred import NormRecord, NormRep, Workspace, batched_per_example, group
from gnq_core.engine.kernels.fused import sync_free
from gnq_core.engine.math.representations import DenseRep, OneHotFactor, OuterRep, Rep, restrict_rows
from gnq_core.engine.passes.extension_points import ExtensionPoints
from gnq_core.engine.plan.assignment import Hooked

# Per-example gradients at most this wide (elements per example) are not turned into a Gram
# block at once but kept for one joint Gram per step; more than DEFER_TOTAL kept are flushed.
DEFER_WIDTH = 2**16
DEFER_TOTAL = 2**18


@dataclass
class Call:
    """One forward call of a covered module, until its output gradients have arrived."""

    hooked: Hooked
    saved: Any
    out_meta: list[tuple[torch.Size, torch.dtype, torch.device]]
    grads: list[torch.Tensor | None]
    received: int = 0
    done: bool = False


@dataclass
class PassState:
    """State of one forward/backward: which calls used which parameter, and the K so far."""

    batch_size: int
    grams: ExtensionPoints  # forms every block of K
    budget: int  # bytes of norm layers' factors kept for compute()
    workspace: Workspace
    calls: list[Call] = field(default_factory=list)
    uses: Counter = field(default_factory=Counter)  # id(param) -> calls that used it
    finished_uses: Counter = field(default_factory=Counter)
    pending: dict[int, list[Rep]] = field(default_factory=dict)  # shared params' earlier uses
    restricted_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    kernel: torch.Tensor | None = None
    fired: bool = False
    repeated: bool = False
    paths: dict[str, set[str]] = field(default_factory=dict)
    call_counts: Counter = field(default_factory=Counter)
    # outputs of input-end modules, with their version when the hook saw them and their module
    frontier: list[tuple[torch.Tensor, int, list[torch.Tensor]]] = field(default_factory=list)
    used_beyond_lookups: set[int] = field(default_factory=set)  # params used by non-lookup calls
    # activation checkpointing: calls registered by each module's forward before the backward, and
    # the recomputations of them seen inside the backward so far (engine/passes/recompute.py)
    forward_calls: Counter = field(default_factory=Counter)
    recomputed: Counter = field(default_factory=Counter)
    deferred: dict[tuple, list[torch.Tensor]] = field(default_factory=dict)  # narrow G, one Gram later
    acc: dict[tuple, torch.Tensor] = field(default_factory=dict)  # fused Grams by (dtype, device, upper)
    norms: list[NormRecord] = field(default_factory=list)  # norm layers' factors, batched at compute()
    norm_bytes: int = 0

    def register(self, call: Call) -> None:
        h = call.hooked
        self.uses.update(h.param_ids)
        if not h.kernel.row_lookup:
            self.used_beyond_lookups.update(h.param_ids)
        self.calls.append(call)

    def arrive(self, call: Call) -> bool:
        """A gradient of ``call`` arrived in this (current) pass: False if the call was already
        done (a second backward through the same forward)."""
        self.fired = True
        if call.done:
            self.repeated = True
            return False
        return True

    def add(self, block: torch.Tensor) -> None:
        if self.kernel is None:
            self.kernel = block.clone()
        else:
            self.kernel.add_(block)

    def split(self, h: Hooked) -> frozenset[str]:
        """Parameters of this module that other calls in this pass use too."""
        return frozenset(n for n, pid in zip(h.params, h.param_ids, strict=True) if self.uses[pid] > 1)

    def accumulate(self, call: Call, contributions: list[Contribution], label: str | None = None) -> None:
        """Add one finished call's Gram blocks (and cross terms of shared parameters) to K."""
        h = call.hooked
        call.done = True
        split = self.split(h)
        paths = self.paths.setdefault(h.name, set())
        self.call_counts[h.name] += 1
        ids = h.ids
        for c in contributions:
            shared = len(c.params) == 1 and c.params[0] in split
            if isinstance(c.rep, NormRep):
                if not shared and self.defer_norm(c.rep.record):
                    paths.add(label or "per-example")
                    continue
                c = replace(c, rep=DenseRep(c.rep.materialize()))
            if not shared and isinstance(c.rep, DenseRep) and c.rep.G.shape[1] <= DEFER_WIDTH:
                self.defer(c.rep.G)  # narrow (norm layers, biases): one Gram for all of them
                path = "dense"
            else:
                block, path = self.grams.gram_block(c.rep)
                self.add(block)
            paths.add(label or ("per-example" if path == "dense" else path))
            if shared:  # cross terms with the parameter's other uses
                self.add_cross_terms(call, ids[c.params[0]], c.rep)
                paths.add("tied")
        self.finish_uses(call)

    # A parameter used by several calls in one pass (tied embedding/head weights): g_j is the sum over
    # its uses, so K gains <a_j, b_k> + <b_j, a_k> between every two uses a, b.  Each use's
    # representation waits in ``pending`` until the last use has arrived; for a head tied to an
    # embedding only the token rows the embedding's lookups touch can meet a lookup's gradient, so the
    # waiting representations are cut to those rows (``representations.restrict_rows``).

    def add_cross_terms(self, call: Call, pid: int, rep: Rep) -> None:
        """⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ between this use of a shared parameter and earlier ones."""
        rows = self.restricted_rows.get(pid)
        if rows is not None:
            rep = restrict_rows(rep, rows) or rep
        earlier = self.pending.setdefault(pid, [])
        for other in earlier:
            self.add(self.grams.cross_block(other, rep))
        if rows is None:  # keep only the rows later embedding uses can touch (tied wte/lm_head)
            rows = self.rows_still_needed(call, pid)
            if rows is not None:
                kept = [restrict_rows(r, rows) for r in [*earlier, rep]]
                if all(r is not None for r in kept):
                    self.restricted_rows[pid] = rows
                    earlier[:], rep = kept[:-1], kept[-1]
        earlier.append(rep)

    def rows_still_needed(self, call: Call, pid: int) -> torch.Tensor | None:
        """Token rows of the uses of ``pid`` still to come, if they are all row lookups."""
        tokens = []
        for other in self.calls:
            if other is call or other.done or pid not in other.hooked.param_ids:
                continue
            touched = other.hooked.kernel.rows_touched(other.saved)
            if touched is None:
                return self.grams.merge_rows(None, _device(call))
            tokens.append(touched)
        for rep in self.pending.get(pid, []):
            if isinstance(rep, OuterRep) and isinstance(rep.A, OneHotFactor):
                tokens.append(rep.A.tokens.reshape(-1))
        rows = None
        if tokens:  # sorted, with repeats: counting distinct tokens would wait for the device
            rows = torch.sort(torch.cat([t.to(tokens[0].device) for t in tokens])).values
        return self.grams.merge_rows(rows, _device(call))

    def defer(self, G: torch.Tensor) -> None:
        """Keep narrow per-example gradients [B, n] for one joint Gram (fewer launches per step:
        the Gram of their concatenation is the sum of their Grams)."""
        key = (G.dtype, G.device)
        self.deferred.setdefault(key, []).append(G)
        if sum(g.shape[1] for g in self.deferred[key]) > DEFER_TOTAL:
            self.flush_deferred()

    def flush_deferred(self) -> None:
        for parts in self.deferred.values():
            G = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            block, _ = self.grams.gram_block(DenseRep(G))
            self.add(block)
        self.deferred.clear()

    def defer_norm(self, record: NormRecord) -> bool:
        """Keep a norm layer's factors for ``compute()`` while they fit the memory budget."""
        if self.norm_bytes + record.nbytes > self.budget:
            return False
        self.norms.append(record)
        self.norm_bytes += record.nbytes
        return True

    def flush_norms(self) -> None:
        """Per-example gradients of all deferred norm layers, one stacked pass per shape."""
        with torch.no_grad():  # a fused LayerNorm's saved input still carries its grad_fn
            for records in group(self.norms):
                workspace = None if sync_free(records[0].x) else self.workspace
                self.defer(batched_per_example(records, workspace))
        self.norms.clear()
        self.norm_bytes = 0

    def accumulator(self, dtype: torch.dtype, device: torch.device, upper: bool = False) -> torch.Tensor:
        acc = self.acc.get((dtype, device, upper))
        if acc is None:
            B = self.batch_size
            acc = self.acc[(dtype, device, upper)] = torch.zeros(B, B, dtype=dtype, device=device)
        return acc

    def fold_accumulators(self) -> None:
        for (_, _, upper), acc in self.acc.items():
            if upper:  # only j ≤ k was accumulated (the rest is partial or zero): mirror it
                acc = acc.triu()
                acc = acc + acc.triu(1).T
            self.add(acc if acc.dtype == torch.float64 else acc.to(torch.float64))
        self.acc.clear()

    def finish_uses(self, call: Call) -> None:
        h = call.hooked
        for pid in h.param_ids:
            if self.uses[pid] > 1:
                self.finished_uses[pid] += 1
                if self.finished_uses[pid] == self.uses[pid]:
                    self.pending.pop(pid, None)


def _device(call: Call) -> torch.device:
    """Where the call's covered parameters live."""
    return call.hooked.module.get_parameter(call.hooked.params[0]).device
