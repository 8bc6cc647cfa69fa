"""Cross terms of a parameter used by several calls in one pass (tied embedding/head weights).

g_j of a shared parameter is the sum over its uses, so K gains ⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ between
every two uses a, b.  Each use's representation waits in ``PassState.pending`` until the last
use has arrived.  For a head tied to an embedding, only the token rows that the embedding's
lookups touch can meet a lookup's gradient, so the waiting representations are cut to those
rows (``representations.restrict_rows``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gnq_core.engine.representations import OneHotFactor, OuterRep, Rep, restrict_rows

if TYPE_CHECKING:  # pass_state calls into this module; the types only, for annotations
    from gnq_core.engine.pass_state import Call, PassState


def add_cross_terms(p: PassState, call: Call, pid: int, rep: Rep) -> None:
    """⟨a_j, b_k⟩ + ⟨b_j, a_k⟩ between this use of a shared parameter and earlier ones."""
    rows = p.restricted_rows.get(pid)
    if rows is not None:
        rep = restrict_rows(rep, rows) or rep
    earlier = p.pending.setdefault(pid, [])
    for other in earlier:
        p.add(p.grams.cross_block(other, rep))
    if rows is None:  # keep only the rows later embedding uses can touch (tied wte/lm_head)
        rows = rows_still_needed(p, call, pid)
        if rows is not None:
            kept = [restrict_rows(r, rows) for r in [*earlier, rep]]
            if all(r is not None for r in kept):
                p.restricted_rows[pid] = rows
                earlier[:], rep = kept[:-1], kept[-1]
    earlier.append(rep)


def rows_still_needed(p: PassState, call: Call, pid: int) -> torch.Tensor | None:
    """Token rows of the uses of ``pid`` still to come, if they are all row lookups."""
    tokens = []
    for other in p.calls:
        if other is call or other.done or pid not in other.hooked.param_ids:
            continue
        touched = other.hooked.kernel.rows_touched(other.saved)
        if touched is None:
            return p.grams.merge_rows(None, call.hooked.module.get_parameter(call.hooked.params[0]).device)
        tokens.append(touched)
    for rep in p.pending.get(pid, []):
        if isinstance(rep, OuterRep) and isinstance(rep.A, OneHotFactor):
            tokens.append(rep.A.tokens.reshape(-1))
    rows = None
    if tokens:  # sorted, with repeats: counting distinct tokens would wait for the device
        rows = torch.sort(torch.cat([t.to(tokens[0].device) for t in tokens])).values
    return p.grams.merge_rows(rows, call.hooked.module.get_parameter(call.hooked.params[0]).device)
