"""GNQ over the batch of one optimizer step under torch.distributed: every micro-batch of the
accumulation window on every rank (B_eff = micro × accumulation × world; DESIGN.md §9).

    model = DDP(model)
    with GNQAuditor(model, lam=1e-2, batch="step", scope="global", mode="sketch") as auditor:
        for part in window:                                  # this rank's micro-batches
            (w * per_example_lm_loss(model(**part).logits, part["labels"])).sum().backward()
            auditor.add_micro_batch(w)
        res = auditor.finish_window()     # every rank: the same B_eff × B_eff K and GNQ
        res.local_gnq                     # this rank's texts: res.gnq[res.offset : res.offset + B_r]

The window of all ranks is the concatenation, in rank order, of each rank's window (its
micro-batches in their order); GNQ over it is the GNQ one process gets on those texts as one
window.  At ``finish_window()`` every rank, in the same order:

* says whether its window failed (a non-finite micro-batch: every rank then raises
  ``GNQNumericalError``), how many texts and micro-batches it holds, and whether it sketched;
  if any rank sketched (``mode="sketch"``, or ``auto`` past ``window_budget`` on any rank),
  every rank does;
* sketched: all-gathers the ranks' window sketches ([B_r, m], float32, float64 for a float64
  model; ranks of different B_r are padded and trimmed) and forms K as their Gram;
* exact: forms its rows of K — its own window's exact K (``WindowAuditor.exact_kernel``) and,
  per parameter and use, the ghost/materialised Grams of its kept representations against every
  other rank's (all-gathered one micro-batch × parameter at a time, then dropped: one
  parameter's factors of one micro-batch of every rank are held at once) — and all-gathers the
  rows (B_r × B_eff numbers).

Every rank then solves the same B_eff × B_eff system.  Communication runs on a process group of
its own, as ``DistributedGNQAuditor``'s (every rank must construct the auditor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gnq_core.engine.math.representations import Rep
from gnq_core.engine.math.solve import GNQNumericalError
from gnq_core.engine.passes.distributed import (
    Comm,
    CommStats,
    OwnComm,
    RankRows,
    exchange_layout,
    gather_factors,
    unwrap_model,
)
from gnq_core.engine.passes.window import WindowAuditor, WindowResult

Window = list[Any]  # the window's micro-batch records (WindowAuditor's)

__all__ = ["DistributedWindowAuditor", "DistributedWindowResult"]


@dataclass
class DistributedWindowResult(RankRows, WindowResult):
    """A window's result over every rank's window (``sizes``: texts in every rank's window)."""


class DistributedWindowAuditor(OwnComm, WindowAuditor):
    """``WindowAuditor`` whose window is every rank's window (see the module doc).

    Other arguments as ``WindowAuditor`` (mode, sketch, window_budget...).

    Args:
        model: the model, wrapped in DDP or not (hooks go on the inner module).
        group: the process group whose ranks pool their windows (default: all ranks).
    """

    def __init__(self, model: nn.Module, lam: float = 1e-2, *, group: Any = None, **kwargs: Any) -> None:
        inner_model = unwrap_model(model)
        super().__init__(inner_model, lam, **kwargs)
        self._comm = Comm.create(group)
        self._sizes: list[int] = []
        # sketches cross the wire in the dtype they are formed in: float64 only for a float64 model
        first = next(inner_model.parameters(), None)
        self._wire = torch.float64 if first is not None and first.dtype == torch.float64 else torch.float32
        self._device = first.device if first is not None else torch.device("cpu")  # where gathers run

    def finish_window(self) -> DistributedWindowResult:
        """GNQ of every text of every rank's window against all the others; starts a new window.
        A collective: every rank calls it at the same optimizer step."""
        self._comm.stats = CommStats()
        window = self._window
        state = torch.tensor([int(self._failure is not None), sum(m.batch_size for m in window), len(window),
                              int(self._window_mode == "sketch")], dtype=torch.long, device=self._device)
        states = [[int(x) for x in s] for s in self._comm.gather(state, "meta")]
        failed = [r for r, s in enumerate(states) if s[0]]
        if failed and self._failure is None:  # the window is over on every rank
            self._failure = GNQNumericalError(f"rank {failed[0]} had a non-finite loss or gradient")
        if not failed and any(s[2] == 0 for s in states):
            self._window, self._kept_bytes = [], 0
            raise RuntimeError("finish_window(): some rank's window is empty; every rank must add its "
                               "micro-batches before the step")
        if any(s[3] for s in states) and self._window_mode != "sketch":  # one rank outgrew the budget
            self._switch_to_sketch()
        self._sizes = [s[1] for s in states]
        res = super().finish_window()
        sizes, rank = self._sizes, self.rank
        return DistributedWindowResult(**vars(res), rank=rank, world_size=self.world_size,
                                       offset=sum(sizes[:rank]), local_size=sizes[rank], sizes=list(sizes),
                                       comm=self._comm.stats)

    # ------------------------------------------------------------------ the window's K
    def sketch_kernel(self, window: Window) -> torch.Tensor:
        S = self.window_sketches(window, self._wire)
        if self.world_size > 1:
            dims = torch.tensor(list(S.shape), dtype=torch.long, device=self._device)
            shapes = [tuple(int(x) for x in d) for d in self._comm.gather(dims, "meta")]
            if len({s[1] for s in shapes}) != 1:
                raise RuntimeError("GNQAuditor(batch='step', scope='global'): the ranks' sketches have "
                                   f"different widths ({sorted({s[1] for s in shapes})}); every rank must "
                                   "run the same model with the same SketchSpec")
            S = torch.cat([t.to(S.device) for t in self._comm.gather(S.to(self._device), "sketches", shapes)])
        S = S.to(torch.float64)
        return S @ S.T

    def exact_kernel(self, window: Window) -> torch.Tensor:
        own = super().exact_kernel(window)
        if self.world_size == 1:
            return own
        sizes, rank = self._sizes, self.rank
        offsets = [sum(sizes[:r]) for r in range(len(sizes) + 1)]
        rows = torch.zeros(sizes[rank], offsets[-1], dtype=torch.float64, device=own.device)
        rows[:, offsets[rank]:offsets[rank + 1]] = own
        starts, weights = self._window_layout(window)
        for b, m in enumerate(window):
            for key in sorted(m.reps):
                for rep in m.reps[key]:  # every rank's representation of one use in its micro-batch b
                    for r, theirs in enumerate(gather_factors(self._comm, *exchange_layout(self._comm, rep))):
                        if r != rank:
                            start = offsets[r] + starts[r][b]
                            self._add_cross(rows, window, key, theirs, weights[r][b], start)
        return torch.cat([t.to(own.device) for t in self._comm.gather(rows.to(self._device), "kernel")])

    def _add_cross(self, rows: torch.Tensor, window: Window, key: str, theirs: Rep,
                   their_weights: torch.Tensor | None, start: int) -> None:
        """rows[own texts, their texts] += ⟨g_j, g_k⟩ of one use of ``key`` on another rank."""
        row = 0
        for m in window:
            for mine in m.reps.get(key, []):
                block = self.pair_gram(mine, theirs)[0].to(rows.device)
                if m.weights is not None:
                    block = block / m.weights.to(rows.device).reshape(-1, 1)
                if their_weights is not None:
                    block = block / their_weights.to(rows.device).reshape(1, -1)
                rows[row:row + m.batch_size, start:start + block.shape[1]] += block
            row += m.batch_size

    def _window_layout(self, window: Window
                       ) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]:
        """Every rank's start of each of its micro-batches in its window, and their weights;
        checks that the ranks' windows have the same structure (else the gathers would not pair)."""
        structure = torch.tensor([len(window), *(len(m.reps) for m in window),
                                  *(sum(len(v) for v in m.reps.values()) for m in window)],
                                 dtype=torch.long, device=self._device)
        if any(not torch.equal(s, structure) for s in self._comm.gather(structure, "meta")):
            raise RuntimeError("GNQAuditor(batch='step', scope='global'): the ranks' windows differ in "
                               "micro-batches or parameters; every rank must run the same model for the "
                               "same number of micro-batches per optimizer step")
        sizes = torch.tensor([m.batch_size for m in window], dtype=torch.long, device=self._device)
        starts = [[0, *torch.cumsum(s, 0)[:-1].tolist()] for s in self._comm.gather(sizes, "meta")]
        weights: list[list[torch.Tensor | None]] = [[] for _ in range(self.world_size)]
        for m in window:
            w = m.weights if m.weights is not None else torch.zeros(0, dtype=torch.float64)
            head = torch.tensor([int(m.weights is not None)], dtype=torch.long, device=self._device)
            flags = self._comm.gather(head, "meta")
            every = self._comm.gather(w.to(self._device), "kernel")
            for r, (f, t) in enumerate(zip(flags, every, strict=True)):
                weights[r].append(t.cpu() if int(f) else None)
        return starts, weights
