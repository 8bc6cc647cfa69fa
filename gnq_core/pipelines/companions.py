"""Post-hoc GNQ against a companion set (``gnq audit --companions N|all``; DESIGN.md §9).

The texts are cut into seeded companion sets of N + 1 texts (copies of a text in different sets
whenever the data allow it, as for batches; ``all``: one set of every text).  For each set, one
pass in micro-batches of ``batch_size`` reduces every text's gradient to its sketch
(``WindowAuditor`` in sketch mode: output gradients only, no weight gradients), and GNQ of each
text against the set's other texts comes from the sketches (``engine.companions``).  The set is
the rows' GNQ batch: its ``batches`` row has gnq_mode 'companions', size N + 1 (each text is
measured against size − 1 others), sketch_k and sketch_seed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from gnq_core.engine.companions import SketchRows, companion_gnq
from gnq_core.engine.losses import lm_target_counts, per_example_lm_loss
from gnq_core.engine.window import WindowAuditor
from gnq_core.pipelines.companion_plan import sketch_spec
from gnq_core.pipelines.membership import TOKEN_SIGNALS, token_signals
from gnq_core.pipelines.scoring import Scores, score_batch
from gnq_core.pipelines.settings import AuditSettings
from gnq_core.progress import Reporter
from gnq_core.results.records import MIN_BATCH_SIZE, BatchResult, ScoreColumns
from gnq_core.runtime import release_freed_memory
from gnq_core.sources.tokens import Partition, seeded_partition, stream_batches

COMPANIONS_MODE = "companions"  # batches.gnq_mode of a companion set


def companion_sets(n_texts: int, settings: AuditSettings, clusters: Sequence[int] | np.ndarray | None = None
                   ) -> Partition:
    """The seeded companion sets of an audit with ``settings.companions``: N + 1 texts each (the
    last the remainder), or one set of every text."""
    size = settings.companion_set_size
    if size is None:
        raise ValueError("companion_sets needs settings.companions")
    return seeded_partition(n_texts, size or max(n_texts, 1), settings.seed, clusters)


def _micro_batches(texts: list[int], batch_size: int) -> Partition:
    n = len(texts)
    return Partition(np.asarray(texts, dtype=np.int64),
                     np.append(np.arange(0, n, batch_size, dtype=np.int64), n))


def audit_companions(model: torch.nn.Module, tokenizer, texts: Sequence[str], sets: Partition,
                     indices: Sequence[int], settings: AuditSettings, device: torch.device,
                     reporter: Reporter | None = None, *, trainable_only: bool = False
                     ) -> tuple[ScoreColumns, list[BatchResult]]:
    """GNQ, loss, sketched self-influence and the forward signals of every text of the companion
    sets ``indices`` at the model's current weights; one ``BatchResult`` per set."""
    spec = sketch_spec(settings)
    capacity = sum(sets.size(k) for k in indices)
    columns, results = ScoreColumns(capacity, TOKEN_SIGNALS), []
    model.eval()
    if not trainable_only:
        for p in model.parameters():
            p.requires_grad_(True)
    dtype = next(model.parameters()).dtype
    hold = torch.float64 if dtype == torch.float64 else torch.float32  # the sketches as computed
    with WindowAuditor(model, lam=settings.lam, mode="sketch", sketch=spec, keep_exact=False) as auditor:
        for index in indices:
            t0 = time.perf_counter()
            members = sets.batch(index)
            micro = _micro_batches(members, settings.batch_size)
            losses, targets, extra = [], [], {}
            held = SketchRows(len(members))
            for batch in stream_batches(tokenizer, texts, micro, range(len(micro)), settings.max_length):
                b = batch.to(device)
                logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
                loss = per_example_lm_loss(logits, b.labels, settings.loss)
                auditor.backward(loss.sum())  # output gradients only
                auditor.add_micro_batch()
                held.put(auditor.take_sketches(hold), auditor.sketcher.widths())  # parts let go now
                model.zero_grad(set_to_none=True)
                losses.append(loss.detach())
                targets.append(lm_target_counts(b.labels))
                for name, values in token_signals(logits, b.labels).items():
                    extra.setdefault(name, []).append(values)
                if reporter is not None:
                    reporter.advance(len(batch.example_ids))

            def solve(n: int = len(members), rows: SketchRows = held
                      ) -> Scores:
                if n < MIN_BATCH_SIZE:  # a set of one text has no companions: NULL GNQ, K_jj kept
                    S = rows.take().to(torch.float64)
                    return None, (S * S).sum(dim=1), None, n
                # the sketches go straight in: the n × n path frees them once their Gram exists
                release_freed_memory()  # and the pass's freed heap goes before the Gram's n × n
                sol = companion_gnq(rows.take(), settings.lam, settings.lam_mode)
                return sol.gnq, sol.self_influence, sol.condition, n

            rows, result = score_batch(solve, torch.cat(losses), members, targets=torch.cat(targets),
                                       batch_index=int(index), step=None, started=t0,
                                       extra={name: np.concatenate(parts) for name, parts in extra.items()},
                                       gnq_mode=COMPANIONS_MODE, sketch_k=spec.k, sketch_seed=spec.seed)
            columns.add(rows)
            results.append(result)
    return columns, results

