"""One GNQ batch's records from the auditor, the same way in training, audits and the Trainer."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch

from gnq_core.attacks.membership import token_signals
from gnq_core.engine.auditor import GNQAuditor, GNQResult
from gnq_core.engine.math.losses import lm_target_counts
from gnq_core.engine.math.solve import GNQNumericalError
from gnq_core.results.records import MIN_BATCH_SIZE, BatchResult, ScoreColumns, batch_results

Values = Sequence[float] | torch.Tensor  # per text; tensors go to the columns without a list between

# gnq, self-influence (K_jj) of this process's texts, condition of K + λI, GNQ batch size (None: the texts)
Scores = tuple[Values | None, Values, float | None, int | None]


def scores_of(res: GNQResult) -> Scores:
    """A batch of one text has no companions: its GNQ is NULL (K_jj/λ is not GNQ), K_jj kept."""
    gnq = res.gnq if res.batch_size >= MIN_BATCH_SIZE else None
    return gnq, res.self_influence, res.condition, None


def score_batch(compute: Callable[[], Scores], losses: torch.Tensor,
                example_ids: Sequence[int] | torch.Tensor, *, targets: torch.Tensor, batch_index: int,
                step: int | None, started: float,
                extra: Mapping[str, Values] | None = None, gnq_mode: str = "exact",
                sketch_k: int | None = None, sketch_seed: int | None = None
                ) -> tuple[ScoreColumns, BatchResult]:
    """Run ``compute`` (the auditor's solve) and record the batch as score columns.  A batch whose
    loss or kernel is not finite is recorded with ``finite = False`` and NULL scores instead of
    stopping the job.  ``targets``: each text's number of next-token targets (``lm_target_counts``);
    a text with none (a single token) has no loss and no gradient, so its GNQ, loss and K_jj are
    NULL, not 0.  ``extra``: further per-text columns from the forward pass
    (``membership.token_signals``).  ``compute`` may return gnq None: a window of fewer than 2
    texts has no companions (NULL GNQ).  ``gnq_mode``/``sketch_k``/``sketch_seed``: how K was
    formed (recorded with the batch)."""
    finite = bool(torch.isfinite(losses).all())
    gnq = kjj = condition = size = None
    try:
        gnq, kjj, condition, size = compute()  # raises on a non-finite kernel (e.g. from a NaN loss)
    except GNQNumericalError:
        finite = False
    if not finite:
        gnq = kjj = condition = None
    return batch_results(example_ids, losses, gnq, kjj, batch_index=batch_index, step=step,
                         condition=condition, finite=finite, seconds=time.perf_counter() - started, size=size,
                         extra=extra, scored=targets > 0, gnq_mode=gnq_mode, sketch_k=sketch_k,
                         sketch_seed=sketch_seed)


def score_pass(auditor: GNQAuditor, logits: torch.Tensor, labels: torch.Tensor, losses: torch.Tensor,
               example_ids: Sequence[int], *, batch_index: int, step: int | None, started: float,
               weights: torch.Tensor | None = None) -> tuple[ScoreColumns, BatchResult]:
    """``score_batch`` of the auditor's last backward (``weights`` as in ``compute``), with its signals."""
    return score_batch(lambda: scores_of(auditor.compute(weights=weights)), losses, example_ids,
                       targets=lm_target_counts(labels), batch_index=batch_index, step=step, started=started,
                       extra=token_signals(logits, labels))
