"""In-run audited training: GNQ of every example at every step, from the training's own backward.

The one training loop (training_loop.py: seeded shuffles per epoch, AdamW, per-example mean NLL
averaged over the batch) with its three callbacks (their docstrings say what each does):
``GNQScores``, the auditor reading the backward that makes the update; ``Checkpoints``,
RUN_DIR/epoch-K after each epoch, saved before the epoch's scores are committed; ``Progress``.
A rerun of an unfinished run continues after its last finished epoch.  The batches are the
training's own (plain seeded shuffles); when two copies of a text share one, the store shows
that text's GNQ as measured with a copy in the batch (``gnq_with_copy``) and ``gnq train``
reports how many steps had one (``Store.steps_with_copies``).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gnq_core.common.atomic import check_folder_target
from gnq_core.common.progress import Reporter
from gnq_core.common.runtime import code_version, resolve_device, resolve_dtype, seed_everything
from gnq_core.engine.auditor import GNQAuditor
from gnq_core.pipelines.finite_share import check_mostly_finite
from gnq_core.pipelines.resume import resume_from
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.pipelines.training_loop import Checkpoints, GNQScores, Progress, adamw, seeded_batches, train
from gnq_core.results.protected_paths import OverwriteError, refuse_overwrite, verify_checkpoint
from gnq_core.results.records import RunSpec
from gnq_core.results.store import Store
from gnq_core.results.store_queries import Run
from gnq_core.sources.checkpoints.checks import check_checkpoint
from gnq_core.sources.checkpoints.files import checkpoint_hash
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.models import build_model, train_tokenizer
from gnq_core.sources.text_labels import dataset_labels, secret_settings
from gnq_core.sources.tokens import encode_texts, pad_id

# How the weight gradient is formed, recorded in the run settings (gnq_core.engine.kernels.fused).
WEIGHT_GRADIENTS = "fused: the sum of the per-example gradients the audit forms"


def run_training(store: Store, dataset: TextDataset, out_dir: str | Path, *, name: str,
                 init: str | Path | None = None, settings: TrainSettings = TrainSettings(),
                 reporter: Reporter | None = None) -> Run:
    """Train (from scratch, or fine-tune ``init``) with in-run GNQ; resumes an unfinished run."""
    reporter = reporter or Reporter()
    out_dir = Path(out_dir).resolve()
    device = resolve_device(settings.device)
    spec = _run_spec(dataset, out_dir, name, init, settings, device)
    run = store.resumable_run(spec)
    start_epoch = 0
    if run is None:
        _refuse_overwrite(store, out_dir, 0, settings.epochs, dataset, init, None)
        model, tokenizer, optimizer, init_hash = start_training(dataset, init, settings, device)
        ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
        examples = pd.DataFrame({"example_id": range(len(dataset)), "text": dataset.texts,
                                 "grp": dataset.groups, "n_tokens": [len(x) for x in ids]})
        run = store.create_run(replace(spec, model_hash=init_hash),
                               pd.concat([examples, dataset_labels(dataset)], axis=1))
    else:
        finished = store.points(run.run_id).query("status == 'done'")["point"]
        # A run killed during its first epoch has no finished epoch: start it over.
        start_epoch = settings.epochs if run.status == "done" else (
            int(finished.max()) + 1 if len(finished) else 0)
        if start_epoch >= settings.epochs:
            reporter.log(f"run {run.name!r} has finished all {settings.epochs} epochs; nothing to do")
            store.set_status(run.run_id, "done")
            return store.run(run.run_id)
        _refuse_overwrite(store, out_dir, start_epoch, settings.epochs, dataset, init, run.run_id)
        if start_epoch == 0:
            model, tokenizer, optimizer, _ = start_training(dataset, init, settings, device)
        else:
            resume_at = out_dir / f"epoch-{start_epoch}"
            stored = store.points(run.run_id).set_index("point")["model_hash"].get(start_epoch - 1)
            verify_checkpoint(resume_at, stored, f"run {run.name!r}'s epoch-{start_epoch}")
            model, tokenizer, optimizer, _ = start_training(dataset, init, settings, device, resume_at)
            reporter.log(f"resuming run {run.name!r} after epoch {start_epoch}")
        ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
        store.set_status(run.run_id, "running")

    store.add_points(run.run_id, [dict(point=e, label=f"epoch-{e + 1}", kind="epoch",
                                       path=str(out_dir / f"epoch-{e + 1}")) for e in range(settings.epochs)])
    # Fused: the per-example gradients the audit forms anyway are summed into the weight gradient,
    # so autograd's own weight-gradient matmuls are skipped (same step up to float rounding).
    auditor = GNQAuditor(model, lam=settings.lam, lam_mode=settings.lam_mode, fused=True)
    with store.tracking(run.run_id), auditor:
        train(model, optimizer, ids, pad_id(tokenizer), device,
              seeded_batches(range(len(ids)), settings.batch_size, settings.seed),
              epochs=range(start_epoch, settings.epochs), loss=settings.loss,
              callbacks=[Progress(reporter, settings.epochs),
                         Checkpoints(model, tokenizer, optimizer, out_dir),  # saved before the rows name it
                         GNQScores(auditor, store, run.run_id)])
        check_mostly_finite(store, run)  # inside tracking: a numerical failure marks the run 'failed'
    return store.run(run.run_id)


def _refuse_overwrite(store: Store, out_dir: Path, start_epoch: int, epochs: int, dataset: TextDataset,
                      init: str | Path | None, run_id: int | None) -> None:
    """The epoch folders still to be written must not be (or hold) another run's checkpoint, the
    store, a dataset or this run's inputs; a new run must not replace folders it did not make."""
    targets = [out_dir / f"epoch-{e + 1}" for e in range(start_epoch, epochs)]
    for target in (out_dir, *targets):
        check_folder_target(target, "a training run's folder")  # never a FIFO, a device or a file
    refuse_overwrite(targets, store, inputs=[dataset.path, init], except_run=run_id)
    existing = [t for t in targets if t.exists()] if run_id is None else []
    if existing:
        raise OverwriteError(f"{existing[0]}: already exists and this run did not make it; choose "
                             "another --out (or remove it)")


def start_training(dataset: TextDataset, init: str | Path | None, settings: TrainSettings,
                   device: torch.device, resume_at: Path | None = None,
                   ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, torch.optim.Optimizer, str | None]:
    """The model on ``device`` in the settings' dtype, its tokenizer, ``gnq train``'s optimizer and
    ``init``'s hash: a fresh start (``_initial_model``), or the training saved in ``resume_at``
    continued exactly where it left off (resume.py).  The studies' pretraining starts here too."""
    init_hash = optimizer_state = None
    if resume_at is None:
        model, tokenizer, init_hash = _initial_model(dataset, init, settings)
    else:
        model, tokenizer, optimizer_state, rng_state = resume_from(resume_at)
    model.to(device=device, dtype=resolve_dtype(settings.dtype))
    optimizer = adamw(model, settings)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
        torch.set_rng_state(rng_state)
    return model, tokenizer, optimizer, init_hash


def _initial_model(dataset: TextDataset, init: str | Path | None, settings: TrainSettings):
    """Seeded: ``init``'s model, or a BPE tokenizer trained on the texts and a fresh model."""
    seed_everything(settings.seed)
    if init is not None:
        check_checkpoint(init, settings.max_length)
        model, tokenizer = load_checkpoint(init)
        return model, tokenizer, checkpoint_hash(Path(init))
    tokenizer = train_tokenizer(dataset.texts, vocab_size=settings.vocab_size)
    model = build_model(settings.preset, vocab_size=len(tokenizer), max_length=settings.max_length,
                        seed=settings.seed, eos_token_id=tokenizer.eos_token_id)
    return model, tokenizer, None


def _run_spec(dataset: TextDataset, out_dir: Path, name: str, init: str | Path | None,
              settings: TrainSettings, device: torch.device) -> RunSpec:
    """The run's description; a rerun must match it (all settings but the device)."""
    extra = asdict(settings) | {"init": str(Path(init).resolve()) if init else None,
                                "from_scratch": init is None, "text_column": dataset.text_column,
                                "group_column": dataset.group_column, "weight_gradients": WEIGHT_GRADIENTS,
                                # each step is one batch, no accumulation: GNQ's batch is the update's
                                "gnq_batch": "one optimizer step", "b_eff": settings.batch_size,
                                "gnq_mode": "exact", **secret_settings(dataset)}
    return RunSpec(
        name=name, kind="train", lam=settings.lam, batch_size=settings.batch_size, seed=settings.seed,
        max_length=settings.max_length, model_path=str(out_dir), dataset_path=str(dataset.path),
        dataset_hash=dataset.sha256, n_examples=len(dataset), code_version=code_version(), device=str(device),
        dtype=settings.dtype, settings=extra, loss=settings.loss)
