"""In-run audited training: GNQ of every example at every step, from the training's own backward.

A nanoGPT-style loop, kept readable: seeded shuffles per epoch, AdamW, per-example mean NLL
(losses.py) averaged over the batch, and the auditor reading the same backward that produces
the update (weights 1/B undo the batch mean, DESIGN.md §1).  After each epoch the model is
saved under RUN_DIR/epoch-K (safetensors + tokenizer + trainer state) and the epoch's scores are
committed; a rerun of an unfinished run continues after its last finished epoch.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from gnq_core.engine.auditor import GNQAuditor, check_lam
from gnq_core.engine.losses import per_example_lm_loss
from gnq_core.engine.solve import GNQNumericalError
from gnq_core.progress import Reporter
from gnq_core.results.store import Run, Store, StoreError
from gnq_core.runtime import code_version, resolve_device, resolve_dtype, seed_everything
from gnq_core.sources.checkpoints import check_checkpoint, checkpoint_hash, load_checkpoint, save_checkpoint
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.models import build_model, train_tokenizer
from gnq_core.sources.tokens import batch_partition, collate, encode_texts, pad_id

TRAINER_STATE = "trainer_state.pt"


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 3
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.0
    lam: float = 1e-2
    max_length: int = 128
    seed: int = 0
    preset: str = "tiny"      # from scratch only
    vocab_size: int = 2048    # from scratch only
    device: str = "auto"
    dtype: str = "float32"

    def __post_init__(self) -> None:  # refused before a run is created: no failed run left behind
        check_lam(self.lam)


def run_training(store: Store, dataset: TextDataset, out_dir: str | Path, *, name: str,
                 init: str | Path | None = None, settings: TrainSettings = TrainSettings(),
                 reporter: Reporter | None = None) -> Run:
    """Train (from scratch, or fine-tune ``init``) with in-run GNQ; resumes an unfinished run."""
    reporter = reporter or Reporter()
    if settings.epochs < 1:
        raise ValueError("--epochs must be at least 1")
    out_dir = Path(out_dir).resolve()
    device, dtype = resolve_device(settings.device), resolve_dtype(settings.dtype)
    run = store.find_run(name)
    start_epoch = 0
    if run is None:
        seed_everything(settings.seed)
        model, tokenizer, init_hash = _initial_model(dataset, init, settings)
        ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
        run = _create_train_run(store, dataset, out_dir, name, init, init_hash, settings, device, ids)
        optimizer_state = rng_state = None
    else:
        _check_same_training(store, run, dataset, settings, init)
        finished = store.points(run.run_id).query("status == 'done'")["point"]
        # A run killed during its first epoch has no finished epoch: start it over.
        start_epoch = settings.epochs if run.status == "done" else (
            int(finished.max()) + 1 if len(finished) else 0)
        if start_epoch >= settings.epochs:
            reporter.log(f"run {run.name!r} has finished all {settings.epochs} epochs; nothing to do")
            store.set_status(run.run_id, "done")
            return store.run(run.run_id)
        if start_epoch == 0:
            seed_everything(settings.seed)
            model, tokenizer, _ = _initial_model(dataset, init, settings)
            optimizer_state = rng_state = None
        else:
            model, tokenizer, optimizer_state, rng_state = _resume_from(out_dir / f"epoch-{start_epoch}")
            reporter.log(f"resuming run {run.name!r} after epoch {start_epoch}")
        ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
        store.set_status(run.run_id, "running")

    model.to(device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    if rng_state is not None:
        torch.set_rng_state(rng_state)
    store.add_points(run.run_id, [dict(point=e, label=f"epoch-{e + 1}", kind="epoch",
                                       path=str(out_dir / f"epoch-{e + 1}")) for e in range(settings.epochs)])
    pad = pad_id(tokenizer)
    with store.tracking(run.run_id), GNQAuditor(model, lam=settings.lam) as auditor:
        for epoch in range(start_epoch, settings.epochs):
            _train_epoch(store, run, epoch, model, tokenizer, optimizer, auditor, ids, pad, out_dir,
                         settings, device, reporter)
    return store.run(run.run_id)


def _train_epoch(store: Store, run: Run, epoch: int, model, tokenizer, optimizer, auditor: GNQAuditor,
                 ids: list[list[int]], pad: int, out_dir: Path, settings: TrainSettings,
                 device: torch.device, reporter: Reporter) -> None:
    t0 = time.perf_counter()
    partition = batch_partition(len(ids), settings.batch_size, settings.seed + epoch)
    steps_before = epoch * len(partition)
    reporter.stage(f"epoch {epoch + 1}/{settings.epochs}", len(ids))
    model.train()
    score_rows, batch_rows = [], []
    for index, part in enumerate(partition):
        tb = time.perf_counter()
        step = steps_before + index + 1
        b = collate([ids[i] for i in part], part, pad).to(device)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        losses = per_example_lm_loss(logits, b.labels)
        losses.mean().backward()
        finite = bool(torch.isfinite(losses).all())
        gnq = kjj = condition = None
        try:
            res = auditor.compute(weights=torch.full((len(part),), 1.0 / len(part), dtype=torch.float64))
            if finite:
                gnq, kjj, condition = res.gnq.tolist(), res.self_influence.tolist(), res.condition
        except GNQNumericalError:
            finite = False
        if finite:
            optimizer.step()
        # A non-finite batch is recorded and skipped: stepping on it would corrupt the model.
        optimizer.zero_grad(set_to_none=True)
        loss_values = losses.detach().double().tolist()
        for i, example_id in enumerate(part):
            score_rows.append((example_id, index, step, gnq[i] if gnq else None, loss_values[i],
                               kjj[i] if kjj else None))
        batch_rows.append((index, step, len(part), condition, finite, time.perf_counter() - tb))
        reporter.advance(len(part))
    path = out_dir / f"epoch-{epoch + 1}"
    save_checkpoint(model, tokenizer, path)
    _save_trainer_state(path, optimizer, epoch + 1, steps_before + len(partition))
    scores = pd.DataFrame(score_rows, columns=["example_id", "batch_index", "step", "gnq", "loss",
                                               "self_influence"])
    batches = pd.DataFrame(batch_rows, columns=["batch_index", "step", "size", "condition", "finite",
                                                "seconds"])
    store.write_point(run.run_id, epoch, scores, batches, time.perf_counter() - t0, path=str(path),
                      model_hash=checkpoint_hash(path))


def _initial_model(dataset: TextDataset, init: str | Path | None, settings: TrainSettings):
    if init is not None:
        check_checkpoint(init, settings.max_length)
        model, tokenizer = load_checkpoint(init)
        return model, tokenizer, checkpoint_hash(Path(init))
    tokenizer = train_tokenizer(dataset.texts, vocab_size=settings.vocab_size)
    model = build_model(settings.preset, vocab_size=len(tokenizer), max_length=settings.max_length,
                        seed=settings.seed, eos_token_id=tokenizer.eos_token_id)
    return model, tokenizer, None


def _save_trainer_state(path: Path, optimizer: torch.optim.Optimizer, epochs_done: int, step: int) -> None:
    """Optimizer and RNG state beside the weights, so a rerun continues exactly where this left off."""
    tmp = path / f"{TRAINER_STATE}.tmp-{os.getpid()}"
    torch.save({"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                "epochs_done": epochs_done, "step": step}, tmp)
    os.replace(tmp, path / TRAINER_STATE)


def _resume_from(path: Path):
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise StoreError(f"{path}: cannot resume, {TRAINER_STATE} is missing; start a new run with "
                         "another --name")
    model, tokenizer = load_checkpoint(path)
    state = torch.load(state_file, map_location="cpu", weights_only=True)  # never unpickle code
    return model, tokenizer, state["optimizer"], state["rng"]


def _create_train_run(store: Store, dataset: TextDataset, out_dir: Path, name: str, init, init_hash,
                      settings: TrainSettings, device: torch.device, ids: list[list[int]]) -> Run:
    examples = pd.DataFrame({"example_id": range(len(dataset)), "text": dataset.texts,
                             "grp": dataset.groups, "n_tokens": [len(x) for x in ids]})
    extra = asdict(settings) | {"init": str(Path(init).resolve()) if init else None,
                                "from_scratch": init is None, "text_column": dataset.text_column,
                                "group_column": dataset.group_column}
    return store.create_run(
        name=name, kind="train", lam=settings.lam, batch_size=settings.batch_size, seed=settings.seed,
        max_length=settings.max_length, model_path=str(out_dir), model_hash=init_hash,
        dataset_path=str(dataset.path), dataset_hash=dataset.sha256, n_examples=len(dataset),
        code_version=code_version(), device=str(device), dtype=settings.dtype, settings=extra,
        examples=examples)


def _check_same_training(store: Store, run: Run, dataset: TextDataset, settings: TrainSettings,
                         init) -> None:
    if run.kind != "train":
        raise StoreError(f"{store.path}: run {run.name!r} is an {run.kind} run; pick another --name")
    stored = run.settings
    mismatches = [] if run.dataset_hash == dataset.sha256 else ["dataset content"]
    for key, value in asdict(settings).items():
        if key in ("device",):
            continue
        if key in stored and stored[key] != value:
            mismatches.append(f"{key} ({stored[key]} stored, {value} given)")
    if (stored.get("init") or None) != (str(Path(init).resolve()) if init else None):
        mismatches.append("--init")
    if mismatches:
        raise StoreError(f"{store.path}: run {run.name!r} exists with a different {', '.join(mismatches)}; "
                         "use another --name to start a new run")
