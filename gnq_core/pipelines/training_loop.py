"""The one training loop with callbacks: ``gnq train`` and the demo (``train.run_training``), the
studies' pretraining and counterfactual models (without ``GNQScores``) all train through ``train``.

Each batch: the forward, the per-example losses ℓ_j (losses.py), the backward of their batch
mean, the optimizer step.  Callbacks see four events, in the order they are given:
``epoch_begin``, ``after_backward`` (``step.skip = True`` vetoes the update), ``step_end`` and
``epoch_end``.  The Trainer integration is the HF Trainer's own loop (gnq_core.integrations.hf); both
score a batch with ``scoring.score_batch``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gnq_core.attacks.membership import TOKEN_SIGNALS
from gnq_core.common.progress import Reporter
from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.conventions import TOKEN_MEAN
from gnq_core.engine.math.losses import batch_mean_weights, per_example_lm_loss
from gnq_core.pipelines.resume import save_trainer_state
from gnq_core.pipelines.scoring import score_pass
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.results.records import BatchResult, ScoreColumns
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.files import checkpoint_hash
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.tokens import LMBatch, batch_partition, collate

Batches = Callable[[int], list[list[int]]]  # epoch → its batches (lists of indices into ids)


@dataclass
class Epoch:
    number: int  # from 0
    batches: list[list[int]]
    started: float
    checkpoint: Path | None = None  # set by ``Checkpoints`` at the epoch's end


@dataclass
class Step:
    index: int  # the batch's number in its epoch
    number: int  # the optimizer step, from 1 over the run
    example_ids: list[int]
    batch: LMBatch
    logits: torch.Tensor
    losses: torch.Tensor  # ℓ_j
    weights: torch.Tensor  # w_j: Σ_j w_j ℓ_j is the objective stepped on
    started: float
    skip: bool = False  # a callback's veto: no optimizer step on this batch


class Callback:
    """What the loop calls; every event does nothing unless overridden."""

    def epoch_begin(self, epoch: Epoch) -> None: ...
    def after_backward(self, step: Step) -> None: ...
    def step_end(self, step: Step) -> None: ...
    def epoch_end(self, epoch: Epoch) -> None: ...


def seeded_batches(indices: Sequence[int], batch_size: int, seed: int) -> Batches:
    """Epoch e's batches: a shuffle of ``indices`` seeded by ``seed + e``, cut into batch_size."""
    return lambda epoch: [[indices[i] for i in part]
                          for part in batch_partition(len(indices), batch_size, seed + epoch)]


def adamw(model: torch.nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    """``gnq train``'s optimizer: AdamW at the settings' learning rate and weight decay."""
    return torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: list[list[int]], pad: int,
          device: torch.device, batches: Batches, *, epochs: Iterable[int], loss: str = TOKEN_MEAN,
          callbacks: Sequence[Callback] = ()) -> None:
    """Train ``epochs`` (numbers from 0; a resumed run starts later) on ``ids``."""
    for e in epochs:
        epoch = Epoch(e, batches(e), time.perf_counter())
        for c in callbacks:
            c.epoch_begin(epoch)
        model.train()
        for index, part in enumerate(epoch.batches):
            started = time.perf_counter()
            b = collate([ids[i] for i in part], list(part), pad).to(device)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            losses = per_example_lm_loss(logits, b.labels, loss)
            # The update is the batch mean of the token means whatever the convention GNQ is measured
            # in; w undoes it: Σ_j w_j ℓ_j is that objective (1/B, or 1/(B n_j) for token sums).
            w = batch_mean_weights(b.labels, loss)
            if loss == TOKEN_MEAN:
                losses.mean().backward()
            else:
                (losses * w.to(device=losses.device, dtype=losses.dtype)).sum().backward()
            number = e * len(epoch.batches) + index + 1
            step = Step(index, number, list(part), b, logits, losses, w, started)
            for c in callbacks:
                c.after_backward(step)
            if not step.skip:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for c in callbacks:
                c.step_end(step)
        for c in callbacks:
            c.epoch_end(epoch)


class GNQScores(Callback):
    """In-run GNQ: every example's GNQ from the backward that makes the update (weights w_j undo
    the batch mean, DESIGN.md §1), its loss, K_jj and forward signals; a non-finite batch is
    recorded and not stepped on.  At each epoch's end its rows go to ``store`` as point
    ``epoch`` (with the checkpoint ``Checkpoints`` saved, when it comes first)."""

    def __init__(self, auditor: GNQAuditor, store: Store, run_id: int) -> None:
        self.auditor, self.store, self.run_id = auditor, store, run_id
        self.columns = ScoreColumns()
        self.results: list[BatchResult] = []

    def epoch_begin(self, epoch: Epoch) -> None:
        self.columns = ScoreColumns(sum(map(len, epoch.batches)), TOKEN_SIGNALS)
        self.results = []

    def after_backward(self, step: Step) -> None:
        rows, result = score_pass(self.auditor, step.logits, step.batch.labels, step.losses, step.example_ids,
                                  batch_index=step.index, step=step.number, started=step.started,
                                  weights=step.weights)
        self.columns.add(rows)
        self.results.append(result)
        step.skip = step.skip or not result.finite  # stepping on it would corrupt the model

    def epoch_end(self, epoch: Epoch) -> None:
        path = epoch.checkpoint
        self.store.write_point(self.run_id, epoch.number, self.columns, self.results,
                               time.perf_counter() - epoch.started, path=None if path is None else str(path),
                               model_hash=None if path is None else checkpoint_hash(path))


class Checkpoints(Callback):
    """At each epoch's end the model and tokenizer under ``out_dir/epoch-K`` (K = epoch + 1) and
    the trainer state a rerun resumes from (resume.py: optimizer, RNG)."""

    def __init__(self, model: torch.nn.Module, tokenizer, optimizer: torch.optim.Optimizer,
                 out_dir: Path) -> None:
        self.model, self.tokenizer, self.optimizer, self.out_dir = model, tokenizer, optimizer, out_dir

    def epoch_end(self, epoch: Epoch) -> None:
        epoch.checkpoint = self.out_dir / f"epoch-{epoch.number + 1}"
        save_checkpoint(self.model, self.tokenizer, epoch.checkpoint)
        save_trainer_state(epoch.checkpoint, self.optimizer, epoch.number + 1,
                           (epoch.number + 1) * len(epoch.batches))


class Progress(Callback):
    """One reporter stage per epoch ("LABEL K/EPOCHS"), advanced by each batch's texts."""

    def __init__(self, reporter: Reporter, epochs: int, label: str = "epoch") -> None:
        self.reporter, self.epochs, self.label = reporter, epochs, label

    def epoch_begin(self, epoch: Epoch) -> None:
        self.reporter.stage(f"{self.label} {epoch.number + 1}/{self.epochs}", sum(map(len, epoch.batches)))

    def step_end(self, step: Step) -> None:
        self.reporter.advance(len(step.example_ids))
