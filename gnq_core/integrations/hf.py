"""Hugging Face Trainer integration: GNQ of every example of every micro-batch, as Parquet shards.

    from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator

    trainer = GNQTrainer(model=model, args=args, train_dataset=rows,      # rows: input_ids, example_id
                         data_collator=lm_collator(pad_id),
                         gnq=GNQConfig(out="runs/ft-shards", lam=1e-2, scope="global"))
    trainer.train()
    # gnq ingest runs/ft-shards --db data/gnq.duckdb   (or GNQConfig(db=...): rank 0 ingests at the end)

Why a Trainer subclass, why the objective and the gradients are the stock Trainer's, what the
batch of the GNQ is and what the shard rows mean: DESIGN.md §7.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import operator
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback

from gnq_core.attacks.membership import token_signals
from gnq_core.common.runtime import code_version
from gnq_core.common.values import finite, flag, one_of, require, whole
from gnq_core.engine.math.losses import lm_target_counts, per_example_lm_loss
from gnq_core.engine.math.solve import GNQNumericalError
from gnq_core.engine.passes.distributed import DistributedGNQAuditor, Scope, Strategy
from gnq_core.engine.passes.window import DEFAULT_WINDOW_BUDGET, WINDOW_MODES, WindowAuditor
from gnq_core.engine.passes.window_ddp import DistributedWindowAuditor
from gnq_core.engine.plan.compiled import check_no_compile_setting, check_not_compiled
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.pipelines.scoring import Scores, score_batch
from gnq_core.results.precision import observed_precision, precision_note, trainer_precision
from gnq_core.results.records import MIN_BATCH_SIZE, BatchResult, RunSpec, ScoreColumns, check_gnq_settings
from gnq_core.results.shard_files import ShardWriter, new_shard_folder, write_run_file
from gnq_core.sources.tokens import collate

__all__ = ["EXAMPLE_ID", "GNQCallback", "GNQConfig", "GNQTrainer", "GNQTrainerSteps", "checked_examples",
           "example_id", "lm_collator",
           "token_mean_objective"]

EXAMPLE_ID = "example_id"
GNQ_BATCHES = ("step", "micro-batch")


@dataclass
class GNQConfig:
    out: str | Path  # the shards folder (one per training run)
    lam: float = 1e-2
    # Whose texts form the GNQ batch: "global" (every process's) or "rank" (this process's); None:
    # "global" with gnq_batch="step" (the batch of one update), "rank" with "micro-batch".
    scope: Scope | None = None
    strategy: Strategy = "auto"
    flush_every: int = 50  # optimizer steps per shard file (and at every epoch end)
    name: str | None = None  # run name (default: the shards folder's name)
    texts: Sequence[str] | None = None  # texts by example_id, for the store's examples table
    groups: Sequence[str | None] | None = None
    dataset_path: str = "(in memory)"
    max_length: int | None = None  # recorded; default: the model's max_position_embeddings
    db: str | Path | None = None  # ingest the shards into this store when training ends (rank 0)
    check_uses: bool = True
    # Sum the per-example gradients the audit forms into the weight gradient (gnq_core.engine.kernels.fused);
    # only with scope="rank": a global scope forms its Gram across ranks, after autograd; and only
    # with gnq_batch="micro-batch": a window needs each layer's factors, which a fused layer skips.
    fused: bool = True
    # GNQ above which a text counts as flagged in the logged summaries; None: the run's own 90th
    # percentile so far (the Flagged texts page's default threshold, by the same rule).
    flag_gnq: float | None = None
    log_top: int = 3  # ids of the highest-GNQ texts since the last log, as gnq/top{k}_example_id
    # The batch of the GNQ: "step" (default), every micro-batch of one optimizer step's
    # accumulation window on every process (B_eff = per_device_train_batch_size ×
    # gradient_accumulation_steps × world_size; engine.passes.window_ddp; with scope="rank" this
    # process's window alone), or "micro-batch" (each on its own, as before).
    gnq_batch: str = "step"
    window_mode: str = "auto"  # "step" only: "exact", "sketch" or "auto" (exact while it fits)
    sketch: SketchSpec | None = None  # "step" with a sketch: its settings (default SketchSpec())
    window_budget: int = DEFAULT_WINDOW_BUDGET  # bytes of factors an exact window may keep
    # Probe the training set's secret-like values every k optimizer steps (integrations/tracking.py)
    track_secrets: Any = None  # a tracking.SecretTracking, or None

    def __post_init__(self) -> None:
        """Every value checked here, when the config is built: a bad one is one line naming it,
        not a failure at the first step with a shards folder already written."""
        def name(field: str) -> str:
            return f"GNQConfig {field}"

        require(isinstance(self.out, str | PathLike) and str(self.out) != "",
                f"{name('out')} must be a folder path, got {self.out!r}")
        finite(self.lam, name("lam"), 0.0, above=True)
        one_of(self.gnq_batch, name("gnq_batch"), GNQ_BATCHES)
        one_of(self.window_mode, name("window_mode"), WINDOW_MODES)
        one_of(self.scope, name("scope"), (None, "global", "rank"))
        one_of(self.strategy, name("strategy"), ("auto", "factors", "gradients"))
        whole(self.flush_every, name("flush_every (optimizer steps per shard file)"), 1)
        require(self.name is None or (isinstance(self.name, str) and self.name.strip() != ""),
                f"{name('name')} must be a non-empty string or None, got {self.name!r}")
        for field in ("texts", "groups"):
            value = getattr(self, field)
            require(value is None or (hasattr(value, "__getitem__") and not isinstance(value, str | bytes)),
                    f"{name(field)} must be a sequence or mapping by example_id, or None, got "
                    f"{type(value).__name__}")
        require(isinstance(self.dataset_path, str), f"{name('dataset_path')} must be a string")
        if self.max_length is not None:
            whole(self.max_length, name("max_length"), 1)
        require(self.db is None or (isinstance(self.db, str | PathLike) and str(self.db) != ""),
                f"{name('db')} must be a store path or None, got {self.db!r}")
        require(self.db is None or importlib.util.find_spec("duckdb") is not None,
                f"{name('db')}: the store needs the dashboard extra (duckdb): pip install "
                "'gnq-audit[dashboard]', or leave db unset and load the shards later with gnq ingest")
        flag(self.check_uses, name("check_uses")), flag(self.fused, name("fused"))
        if self.flag_gnq is not None:
            finite(self.flag_gnq, name("flag_gnq"), -math.inf)
        whole(self.log_top, name("log_top"), 0)
        require(self.sketch is None or isinstance(self.sketch, SketchSpec),
                f"{name('sketch')} must be a SketchSpec or None, got {type(self.sketch).__name__}")
        whole(self.window_budget, name("window_budget (bytes)"), 1, sys.maxsize)
        if self.track_secrets is not None:  # imported only then: the attack needs the store's engine
            from gnq_core.integrations.tracking import check_tracking

            check_tracking(self.track_secrets)
        if self.scope is None:
            self.scope = "global" if self.gnq_batch == "step" else "rank"


def example_id(value: Any, trainer: str = "GNQTrainer") -> int:
    """A row's ``example_id`` as an int: a whole number (an int, numpy's, or a float with no
    fraction), else ValueError in one line (``int()`` made 0.5 and 0.9 both 0, two texts one id,
    and a text id a traceback)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, float | np.floating):
            if not float(value).is_integer():
                raise TypeError
            return int(value)
        return operator.index(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{trainer}: '{EXAMPLE_ID}' must hold whole numbers (each text's id), got "
                         f"{value!r}") from None


def checked_examples(examples: pd.DataFrame, trainer: str) -> pd.DataFrame:
    """The run's examples table, refused in one line when two rows share an id (their GNQ rows
    would be one text's)."""
    ids = examples["example_id"]
    if ids.duplicated().any():
        twice = ids[ids.duplicated()].iloc[0]
        raise ValueError(f"{trainer}: '{EXAMPLE_ID}' {twice} is given to {int((ids == twice).sum())} rows of "
                         "the training dataset; each text needs its own id (its GNQ rows are keyed by it)")
    return examples


def lm_collator(pad_id: int) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
    """Right-pad rows {input_ids, example_id} into input_ids, attention_mask, labels (−100 on
    padding) and example_id, the convention of ``per_example_lm_loss``."""

    def collate_rows(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        missing = [i for i, r in enumerate(rows) if EXAMPLE_ID not in r]
        if missing:
            raise ValueError(f"GNQTrainer needs an '{EXAMPLE_ID}' in every training row (row {missing[0]} "
                             "has none)")
        ids = [example_id(r[EXAMPLE_ID]) for r in rows]
        b = collate([list(r["input_ids"]) for r in rows], ids, pad_id)
        return {"input_ids": b.input_ids, "attention_mask": b.attention_mask, "labels": b.labels,
                EXAMPLE_ID: torch.tensor(ids, dtype=torch.long)}

    return collate_rows


class GNQCallback(TrainerCallback):
    """Audits each optimizer step's window (or each micro-batch) of a ``GNQTrainer`` and writes
    this rank's shards."""

    def __init__(self, config: GNQConfig, trainer: Trainer) -> None:
        self.config, self.trainer = config, trainer
        self.auditor: DistributedGNQAuditor | WindowAuditor | None = None
        self.writer: ShardWriter | None = None
        self.meta: dict[str, Any] | None = None
        self.rank, self.world, self.batch_size = 0, 1, 0
        self.point, self.micro = -1, 0
        self._epoch_end_step = -1  # the optimizer step of the last epoch end (its checkpoint: on_save)
        self._scored: list[tuple[int, ScoreColumns]] = []  # this process's rows by point, also kept in memory
        # this micro-batch: ids, t0, losses ℓ_j, counts (targets) and signals (Min-K% / Min-K%++)
        self._current: dict[str, Any] = {}
        self._weights: torch.Tensor | None = None
        self._since_log: list[ScoreColumns] = []
        self._pending: list[dict[str, Any]] = []  # the window's micro-batches so far (step mode)
        self.windows_without_gnq = 0  # windows of < 2 texts: no companions, GNQ NULL
        self.precision: dict[str, str] = {}  # compute_dtype, mixed_precision (results/precision.py)
        self.trainer_name = "transformers.Trainer (GNQTrainer)"  # recorded with the run
        # gnq_batch="step" whose window is one micro-batch on one process (no accumulation): the
        # step's texts are that micro-batch's, audited as such (fused weight gradient), the same GNQ
        # as the window auditor's exact path at a step's cost (benchmarks/trainer_step.py)
        self._one_micro = False
        self._watch_precision: Any = None  # a forward hook on the output head until the first step

    def summaries(self) -> dict[str, float]:
        """GNQ since the last log, for the Trainer's own logging (W&B, TensorBoard, MLflow...):
        ``gnq/median``, ``gnq/p99``, ``gnq/threshold`` (``flag_gnq``, or the run's 90th percentile
        so far), ``gnq/above_threshold`` (texts above it) and ``gnq/top{k}_example_id``, and per
        optimizer step ``gnq/b_eff`` and ``gnq/windows_without_gnq``; all numbers (loggers take
        scalars).  Empty when nothing was audited since the last call."""
        since, self._since_log = self._since_log, []
        batch = {"gnq/b_eff": self.batch_size, "gnq/windows_without_gnq": self.windows_without_gnq} \
            if self._windowed and since else {}  # what the batch of these GNQs was
        values, ids = _finite_gnq(since)
        if not len(values):
            return batch
        threshold = self.config.flag_gnq
        if threshold is None:
            threshold = float(np.quantile(_finite_gnq([c for _, c in self._scored])[0], 0.9))
        out = {"gnq/median": float(np.median(values)), "gnq/p99": float(np.quantile(values, 0.99)),
               "gnq/threshold": threshold, "gnq/above_threshold": int((values > threshold).sum())}
        top = np.argsort(-values, kind="stable")[: self.config.log_top]
        out |= {f"gnq/top{k}_example_id": int(ids[i]) for k, i in enumerate(top, start=1)}
        return out | batch

    @property
    def results(self) -> pd.DataFrame:
        """This process's score rows so far, as the shards hold them (point, example_id,
        batch_index, step, gnq, loss, self_influence and the forward signals; NaN: NULL)."""
        frames = [c.frame(point) for point, c in self._scored] or [ScoreColumns().frame(0)]
        return pd.concat(frames, ignore_index=True)

    def _record(self, texts: ScoreColumns, batch: BatchResult) -> None:
        """One scored batch or window: to this rank's shards and the in-memory rows (a global
        batch's ``batches`` row is written once, by rank 0)."""
        self.writer.add(batch.step, self.point, texts, [] if self._global and self.rank != 0 else [batch])
        self._scored.append((self.point, texts))
        self._since_log.append(texts)
        self.micro += 1

    # ------------------------------------------------------------------ trainer events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.rank, self.world = args.process_index, args.world_size
        c = self.config
        self.batch_size = args.per_device_train_batch_size * (self.world if self._global else 1)
        if self._windowed:
            self.batch_size *= args.gradient_accumulation_steps
        check_gnq_settings(c.lam, self.batch_size)  # on every rank, before anything is written
        self._one_micro = (self._windowed and c.window_mode != "sketch" and self.world == 1
                           and args.gradient_accumulation_steps == 1)
        if self._pooled:
            window = DistributedWindowAuditor if self._global else WindowAuditor
            self.auditor = window(model, c.lam, mode=c.window_mode, sketch=self._spec,
                                  window_budget=c.window_budget, check_uses=c.check_uses)
        else:
            scope = "rank" if self._one_micro else c.scope  # one process: its batch is the step's
            self.auditor = DistributedGNQAuditor(model, lam=c.lam, scope=scope, strategy=c.strategy,
                                                 check_uses=c.check_uses, fused=self._fused)
        self.writer = ShardWriter(c.out, self.rank, self.world)
        self.precision = trainer_precision(args, model)
        self._watch_head(model)
        if self.rank == 0:
            examples = checked_examples(self._examples_frame(), self.trainer_name)
            self.meta = new_shard_folder(c.out, self._run_spec(args, state, model, examples), examples,
                                         self.world)

    def _watch_head(self, model: torch.nn.Module) -> None:
        """The precision the first training forward really ran in (a user's own autocast is in no
        argument): read from the output head's output, then the hook is removed."""
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is None:
            self._precision_known()
            return

        def seen(module, inputs, output):
            if not (module.training and torch.is_tensor(output) and output.is_floating_point()):
                return
            self._watch_precision.remove()
            self._watch_precision = None
            autocast = torch.is_autocast_enabled(output.device.type)
            self.precision = observed_precision(output, autocast, self.precision)
            self._precision_known()

        self._watch_precision = head.register_forward_hook(seen)

    def _precision_known(self) -> None:
        """Record the precision in run.json (rank 0) and say once when gradients were half precision."""
        if self.meta is not None:
            run = self.meta["run"]
            run["dtype"] = self.precision["compute_dtype"]
            run["settings"] |= self.precision
            write_run_file(self.config.out, self.meta)
        note = precision_note(self.precision)
        if note is not None and self.rank == 0:
            print(f"GNQ: {note}", file=sys.stderr)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.point, self.micro = self.point + 1, 0

    def on_step_end(self, args, state, control, **kwargs):
        if self._pooled:
            self._finish_window(state.global_step)
        if state.global_step % self.config.flush_every == 0:
            self.writer.flush()

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._windowed and self._pending:  # a window the Trainer did not step (none expected)
            self._finish_window(state.global_step)
        self.writer.flush()
        if self.meta is not None:
            self.meta["points"].append({"point": self.point, "label": f"epoch-{self.point + 1}",
                                        "kind": "epoch", "done": True})
            write_run_file(self.config.out, self.meta)
        self._epoch_end_step = state.global_step

    def on_save(self, args, state, control, **kwargs):
        """The checkpoint the Trainer saves at an epoch's end (``save_strategy="epoch"``) is that
        point's folder, with its weights' hash: ``gnq extract`` attacks it (verified unchanged)."""
        if self.meta is None or not self.meta["points"] or state.global_step != self._epoch_end_step:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        point = self.meta["points"][-1]
        if folder.is_dir() and "path" not in point:
            from gnq_core.sources.checkpoints.files import checkpoint_hash

            point |= {"path": str(folder.resolve()), "model_hash": checkpoint_hash(folder)}
            write_run_file(self.config.out, self.meta)

    def on_train_end(self, args, state, control, **kwargs):
        self.writer.flush()
        if self._watch_precision is not None:
            self._watch_precision.remove()
            self._watch_precision = None
        if self.auditor is not None:
            self.auditor.close()
            self.auditor = None
        if self.meta is not None:
            self.meta["status"] = "done"
            if self._windowed:
                self.meta["windows_without_gnq"] = self.windows_without_gnq  # < 2 texts: GNQ NULL
            write_run_file(self.config.out, self.meta)
        if self.config.db is not None:
            if dist.is_available() and dist.is_initialized():
                dist.barrier()  # every rank's last shard is on disk
            if self.rank == 0:
                from gnq_core.results.shards import ingest
                from gnq_core.results.store import Store

                ingest(Store(self.config.db), self.config.out)

    # ------------------------------------------------------------------ per micro-batch
    def before_forward(self, example_ids: torch.Tensor | None) -> None:
        if example_ids is None:
            raise ValueError(f"GNQTrainer: the batch has no '{EXAMPLE_ID}'; add it to every training "
                             "row and use gnq_core.integrations.hf.lm_collator"
                             " (or a collator that keeps it)")
        self._current, self._weights = {"ids": example_ids.detach().cpu(), "t0": time.perf_counter()}, None

    def watch_losses(self, losses: torch.Tensor, counts: torch.Tensor,
                     signals: dict[str, np.ndarray] | None = None) -> None:
        """Keep ℓ_j (and the forward signals, ``membership.token_signals``); the hook receives
        ∂objective/∂ℓ_j in the backward: the weights w_j."""
        self._current = {**self._current, "losses": losses.detach(), "counts": counts.detach(),
                       "signals": signals}  # a new dict: a window's earlier micro-batches keep theirs
        if losses.requires_grad:
            def keep(grad: torch.Tensor) -> None:
                w = grad.detach().to(torch.float64)
                # an example without targets has ℓ_j ≡ 0 and no gradient: its weight is immaterial
                self._weights = torch.where(counts.to(w.device) == 0, torch.ones_like(w), w)
            losses.register_hook(keep)

    def after_backward(self, state) -> None:
        if self.auditor is None or self._weights is None:
            return
        if self._pooled:  # pooled with the window's other micro-batches at the optimizer step
            self.auditor.add_micro_batch(self._weights)
            self._pending.append(self._current)
            self._weights = None
            return

        def compute() -> Scores:
            res = self.auditor.compute(weights=self._weights)
            gnq = res.local_gnq if res.batch_size >= MIN_BATCH_SIZE else None  # no companions
            if gnq is None and self._one_micro:
                self.windows_without_gnq += 1  # the step's window: one text
            return gnq, res.kernel.diagonal()[res.local], res.condition, res.batch_size

        m = self._current
        texts, batch = score_batch(compute, m["losses"], m["ids"], targets=m["counts"],
                                   batch_index=self._batch_index, step=state.global_step + 1,
                                   started=m["t0"], extra=m["signals"])
        self._record(texts, batch)
        self._weights = None

    def _finish_window(self, step: int) -> None:
        """Score the optimizer step's window: every text against all the window's others."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            res = self.auditor.finish_window()
            mode = res.mode
        except GNQNumericalError as exc:  # recorded as a non-finite batch by score_batch
            res, failure = None, exc
            mode = "sketch" if self.config.window_mode == "sketch" else "exact"
        if res is not None and res.gnq is None:
            self.windows_without_gnq += 1

        def compute() -> Scores:
            if res is None:
                raise failure
            mine = getattr(res, "local", slice(None))  # every rank's window: this rank's texts
            gnq = None if res.gnq is None else res.gnq[mine]
            return gnq, res.kernel.diagonal()[mine], res.condition, res.batch_size

        signals = None
        if all(m["signals"] is not None for m in pending):
            signals = {k: np.concatenate([m["signals"][k] for m in pending]) for k in pending[0]["signals"]}
        texts, batch = score_batch(compute, torch.cat([m["losses"] for m in pending]),
                                   torch.cat([m["ids"] for m in pending]),
                                   targets=torch.cat([m["counts"] for m in pending]),
                                   batch_index=self._batch_index,
                                   step=step, started=pending[0]["t0"], extra=signals,
                                   gnq_mode=mode, sketch_k=None if res is None else res.k,
                                   sketch_seed=None if res is None else res.seed)
        self._record(texts, batch)

    # ------------------------------------------------------------------ run description
    def _examples_frame(self) -> pd.DataFrame:
        ds, c = self.trainer.train_dataset, self.config
        rows = []
        for i in range(len(ds)):
            row = ds[i]
            eid = example_id(row[EXAMPLE_ID], self.trainer_name)
            # a list of texts is indexed by the id (a negative one would read a text from the end)
            listed = c.texts is not None and not isinstance(c.texts, Mapping)
            if listed and not 0 <= eid < len(c.texts):
                raise ValueError(f"{self.trainer_name}: '{EXAMPLE_ID}' {eid} is not an index of "
                                 f"GNQConfig.texts ({len(c.texts)} texts: 0 to {len(c.texts) - 1})")
            text = c.texts[eid] if c.texts is not None else str(row.get("text", ""))
            group = c.groups[eid] if c.groups is not None else row.get("group")
            rows.append((eid, text, group, len(row["input_ids"])))
        return pd.DataFrame(rows, columns=["example_id", "text", "grp", "n_tokens"])

    def _run_spec(self, args, state, model, examples: pd.DataFrame) -> RunSpec:
        c = self.config
        config = getattr(model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        positions = getattr(text_config, "max_position_embeddings", None)  # GPT-2 maps n_positions to it
        steps = {"max_steps": args.max_steps} if args.max_steps > 0 else {}
        epochs = state.num_train_epochs or args.num_train_epochs  # the Trainer's count under max_steps
        content = examples[["example_id", "text"]].to_json(orient="values")
        micro = args.per_device_train_batch_size
        return RunSpec(
            name=c.name or Path(c.out).resolve().name, kind="train", lam=c.lam,
            batch_size=self.batch_size, seed=args.seed,
            max_length=c.max_length or (positions if isinstance(positions, int) else 0),
            model_path=str(args.output_dir), dataset_path=c.dataset_path,
            dataset_hash=hashlib.sha256(content.encode()).hexdigest(), n_examples=len(examples),
            code_version=code_version(), device=str(args.device),
            dtype=self.precision["compute_dtype"],
            settings={"trainer": self.trainer_name, "scope": c.scope,
                      "strategy": c.strategy, "world_size": self.world,
                      "gnq_batch": self._gnq_batch_words(args),
                      **self._window_settings(args),
                      "per_device_train_batch_size": micro,
                      "gradient_accumulation_steps": args.gradient_accumulation_steps,
                      "learning_rate": args.learning_rate, "epochs": epochs,
                      **steps,
                      "flush_every": c.flush_every, **self.precision,
                      "weights_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                      "weight_gradients": "fused" if self._fused else "autograd",
                      **({"gnq_path": "the step's one micro-batch audited as a batch (exact)"}
                         if self._one_micro else {})})

    @property
    def _fused(self) -> bool:
        return self.config.fused and ((not self._global and not self._windowed) or self._one_micro)

    @property
    def _pooled(self) -> bool:
        """Micro-batches pooled into their optimizer step's window by a window auditor."""
        return self._windowed and not self._one_micro

    @property
    def _global(self) -> bool:
        """The GNQ batch pools every process's texts."""
        return self.config.scope == "global"

    @property
    def _batch_index(self) -> int:
        """The GNQ batch within the epoch: a global batch has one index on every rank."""
        return self.micro if self._global else self.micro * self.world + self.rank

    @property
    def _windowed(self) -> bool:
        return self.config.gnq_batch == "step"

    @property
    def _spec(self) -> SketchSpec:
        return self.config.sketch or SketchSpec()

    def _gnq_batch_words(self, args) -> str:
        if not self._windowed:
            return "one micro-batch" + (" of every rank" if self._global else "")
        where = ""
        if self.world > 1:
            where = f" on each of {self.world} processes" if self._global else " of this process"
        return (f"one optimizer step: {args.gradient_accumulation_steps} micro-batch(es) of "
                f"{args.per_device_train_batch_size}{where} (B_eff = {self.batch_size})")

    def _window_settings(self, args) -> dict[str, Any]:
        if not self._windowed:
            return {}
        c = self.config
        out: dict[str, Any] = {"b_eff": self.batch_size, "gnq_mode": c.window_mode,
                               "window_budget": c.window_budget}
        if c.window_mode != "exact":
            out["sketch"] = {"k": self._spec.k, "seed": self._spec.seed, "block": self._spec.block,
                             "vocab_rows": self._spec.vocab_rows, "vocab_cols": self._spec.vocab_cols,
                             "columns": self._spec.columns, "total": self._spec.shared}
        return out


def _finite_gnq(parts: Sequence[ScoreColumns]) -> tuple[np.ndarray, np.ndarray]:
    """The finite GNQ values of ``parts`` and their texts' example ids, in order."""
    gnq = np.concatenate([c.column("gnq") for c in parts]) if parts else np.empty(0)
    ids = np.concatenate([c.example_id[: c.n] for c in parts]) if parts else np.empty(0, np.int64)
    keep = np.isfinite(gnq)
    return gnq[keep], ids[keep]


def token_mean_objective(gnq: GNQCallback | None, logits: torch.Tensor, labels: torch.Tensor,
                         num_items_in_batch: Any = None, *, label_smoothing: float = 0.0,
                         shift: bool = True) -> torch.Tensor:
    """Σ_j n_j ℓ_j / N: the token-mean loss, from per-example losses (ℓ_j and the forward's
    signals handed to ``gnq``, unless None: an evaluation; N: the Trainer's target count over the
    accumulation window, or this batch's when the Trainer gives none).  ``label_smoothing`` ε
    smooths each target's loss as transformers' ``LabelSmoother`` does (engine/math/losses.py), so
    ℓ_j is the per-example loss of the objective stepped on and its GNQ is exact for it."""
    losses = per_example_lm_loss(logits, labels, label_smoothing=label_smoothing, shift=shift)
    counts = lm_target_counts(labels, shift=shift)
    n = counts.to(losses.dtype)
    total = num_items_in_batch if num_items_in_batch is not None else n.sum()
    if torch.is_tensor(total):
        total = total.to(device=losses.device, dtype=losses.dtype)
    if gnq is not None:
        gnq.watch_losses(losses, counts, token_signals(logits, labels))
    return (losses * n).sum() / total


class _TrainerObjective:
    """The stock Trainer's loss, Σ_j n_j ℓ_j / N, formed from per-example losses.  Installed as
    the Trainer's ``label_smoother``, the one loss hook the Trainer calls with the outputs, the
    labels and N: every other decision (whether N counts the accumulation window, the division
    by the accumulation steps, the scaling across devices) stays the Trainer's own, as does the
    user's ``label_smoothing_factor`` ε (the stock smoother's shift rule with ε > 0; without
    smoothing the causal LM's own next-token loss)."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = float(epsilon)
        self.gnq: GNQCallback | None = None  # set for each audited (training) forward

    def __call__(self, model_output: Any, labels: torch.Tensor, shift_labels: bool = False,
                 num_items_in_batch: Any = None) -> torch.Tensor:
        logits = model_output["logits"] if isinstance(model_output, dict) else model_output[0]
        gnq, self.gnq = self.gnq, None
        return token_mean_objective(gnq, logits, labels, num_items_in_batch, label_smoothing=self.epsilon,
                                    shift=shift_labels or self.epsilon == 0)


class GNQTrainerSteps:
    """What every GNQ trainer adds to a Trainer's step and log (GNQTrainer, integrations.trl.GNQSFTTrainer):
    the pass closed after each backward, and GNQ's summaries in every training log."""

    gnq: GNQCallback
    kept_columns: tuple[str, ...] = (EXAMPLE_ID,)  # kept through RemoveColumnsCollator

    def _refuse_compute_loss_func(self, kwargs: dict[str, Any]) -> None:
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError(f"{type(self).__name__} computes the loss from per-example losses itself; "
                             "compute_loss_func cannot be combined with it")

    def _start_gnq(self, callback: GNQCallback) -> None:
        """After the Trainer's own setup: refuse a compiled model, then audit with ``callback``."""
        plugin = getattr(getattr(self.accelerator, "state", None), "dynamo_plugin", None)
        backend = getattr(getattr(plugin, "backend", None), "value", None)
        check_no_compile_setting(bool(self.args.torch_compile), backend)
        check_not_compiled(self.model)
        self.gnq = callback
        self.add_callback(callback)
        self.secret_tracking = None
        if callback.config.track_secrets is not None:  # its own callback: integrations/tracking.py
            from gnq_core.integrations.tracking import SecretTrackingCallback

            c = callback.config
            self.secret_tracking = SecretTrackingCallback(c.track_secrets, self, c.texts, c.out, c.max_length)
            self.add_callback(self.secret_tracking)

    def _set_signature_columns_if_needed(self) -> None:
        super()._set_signature_columns_if_needed()
        self._signature_columns += [c for c in self.kept_columns if c not in self._signature_columns]

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's logging, with GNQ's summaries since the last log added to a training log
        (not an evaluation's), so every ``report_to`` integration shows them beside the loss."""
        if "loss" in logs or "train_loss" in logs:
            logs = {**logs, **self.gnq.summaries()}
            if self.secret_tracking is not None:
                logs |= self.secret_tracking.summaries()
        super().log(logs, *args, **kwargs)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.gnq.after_backward(self.state)
        return loss


class GNQTrainer(GNQTrainerSteps, Trainer):
    """``transformers.Trainer`` with in-run GNQ on every micro-batch (see the module doc)."""

    def __init__(self, *args: Any, gnq: GNQConfig, **kwargs: Any) -> None:
        self._refuse_compute_loss_func(kwargs)
        super().__init__(*args, **kwargs)
        smoother = self.label_smoother  # the Trainer's (label_smoothing_factor), or None
        self.label_smoother = _TrainerObjective(0.0 if smoother is None else smoother.epsilon)
        self._start_gnq(GNQCallback(gnq, self))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = inputs.pop(EXAMPLE_ID, None)
        if model.training and torch.is_grad_enabled():
            if "labels" not in inputs:  # the Trainer would take the model's own loss: no ℓ_j to audit
                raise ValueError("GNQTrainer: the batch has no 'labels'; use "
                                 "gnq_core.integrations.hf.lm_collator (or a collator that sets them)")
            self.gnq.before_forward(ids)
            self.label_smoother.gnq = self.gnq
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)
