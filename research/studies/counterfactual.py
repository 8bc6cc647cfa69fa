"""Counterfactual memorization (Zhang et al. 2021), the common-knowledge studies' comparison:
models fine-tuned on complementary halves of the texts (``cf_subset``), each text's token
accuracy under the models trained with it minus without it (``counterfactual_memorization``),
stored as the metric ``CF_METRIC`` on the fine-tune's run (``counterfactual``).  Shared by
``common_knowledge`` (its own pretrained model) and ``common_knowledge_real`` (a pretrained one)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gnq_core.attacks.forward import forward_batches
from gnq_core.common.atomic import write_text_atomic
from gnq_core.common.runtime import resolve_device
from gnq_core.engine.math.conventions import IGNORE_INDEX
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.pipelines.training_loop import adamw, seeded_batches, train
from gnq_core.results.store_queries import Run
from gnq_core.results.store_schema import StoreError
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.tokens import encode_texts, pad_id
from research.studies.base import StudyContext

CF_METRIC = "counterfactual_memorization"


def cf_subset(n: int, model: int, seed: int) -> list[int]:
    """Training subset of counterfactual model ``model``: models 2q and 2q+1 split one seeded
    permutation of the n texts into complementary halves."""
    perm = np.random.default_rng([seed, 7919, model // 2]).permutation(n)
    half = perm[: n // 2] if model % 2 == 0 else perm[n // 2:]
    return sorted(int(i) for i in half)


def counterfactual_memorization(n: int, subsets: list[list[int]], scores: list[list[float]]) -> pd.DataFrame:
    """mem(x) = mean score on x of the models trained with x − mean of those trained without it.

    Columns: example_id, value (NaN when x was never in or never out), mean_in, mean_out, n_in, n_out.
    """
    s = np.asarray(scores, dtype=float)  # models × examples
    member = np.zeros_like(s, dtype=bool)
    for m, subset in enumerate(subsets):
        member[m, subset] = True
    n_in, n_out = member.sum(0), (~member).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_in = np.where(member, s, 0).sum(0) / n_in
        mean_out = np.where(~member, s, 0).sum(0) / n_out
    return pd.DataFrame({"example_id": np.arange(n), "value": mean_in - mean_out, "mean_in": mean_in,
                         "mean_out": mean_out, "n_in": n_in, "n_out": n_out})


def split_halves(n: int, subsets: list[list[int]],
                 scores: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Counterfactual memorisation from two disjoint halves of the models, each a set of whole
    complementary pairs (pairs 0, 2, 4, … and 1, 3, 5, …), so every record is in and out in both:
    two independent measurements of the same outcome (NaN for both with fewer than 2 pairs)."""
    pairs = len(subsets) // 2
    if pairs < 2:
        return np.full(n, np.nan), np.full(n, np.nan)
    halves = []
    for parity in (0, 1):
        models = [m for m in range(2 * pairs) if (m // 2) % 2 == parity]
        halves.append(counterfactual_memorization(n, [subsets[m] for m in models],
                                                  [scores[m] for m in models])["value"].to_numpy())
    return halves[0], halves[1]


def split_half_reliability(a: np.ndarray, b: np.ndarray, top: float = 0.1) -> dict:
    """How reliable an outcome measured twice is: the halves' Spearman ρ, its Spearman–Brown step-up
    to the whole set of models, 2ρ / (1 + ρ), and the share of one half's top ``top`` that is in the
    other's (chance: ``top``)."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return {"records": int(ok.sum()), "spearman_halves": math.nan, "spearman_brown": math.nan,
                "top_agreement": math.nan}
    rho = float(spearmanr(a[ok], b[ok]).statistic)
    k = max(1, int(round(top * ok.sum())))
    top_a, top_b = (set(np.argsort(-x[ok], kind="stable")[:k]) for x in (a, b))
    return {"records": int(ok.sum()), "spearman_halves": rho,
            "spearman_brown": 2 * rho / (1 + rho) if rho > -1 else math.nan,
            "top_agreement": len(top_a & top_b) / k}


def counterfactual(ctx: StudyContext, run: Run, init: Path, dataset: TextDataset, settings: TrainSettings,
                   n_models: int, folder: Path, reporter) -> pd.DataFrame:
    """Train the counterfactual models not trained yet (one JSON of results per model), then store
    the per-example memorization on ``run`` (replacing earlier values)."""
    folder.mkdir(parents=True, exist_ok=True)
    device = resolve_device(settings.device)
    recipe = {k: v for k, v in asdict(settings).items() if k not in ("device", "preset", "vocab_size")}
    recipe |= {"init": str(init.resolve()), "dataset_hash": dataset.sha256, "score": "token accuracy"}
    _, tokenizer = load_checkpoint(init)
    ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
    results = []
    reporter.stage(f"counterfactual models ({n_models})", n_models)
    for m in range(n_models):
        path = folder / f"model-{m:03d}.json"
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            if saved["recipe"] != recipe:
                raise StoreError(f"{path}: counterfactual model trained with other settings or data; "
                                 "pass --tag NAME to build the study under new names")
        else:
            subset = cf_subset(len(ids), m, settings.seed)
            model, _ = load_checkpoint(init, device=device)
            # gnq train's loop (optimiser, loss, batch order) on the subset, without callbacks
            train(model, adamw(model, settings), ids, pad_id(tokenizer), device,
                  seeded_batches(subset, settings.batch_size, settings.seed), epochs=range(settings.epochs),
                  loss=settings.loss)
            accuracy, loss = _evaluate(model, ids, settings.batch_size, pad_id(tokenizer), device)
            saved = {"recipe": recipe, "subset": subset, "accuracy": accuracy, "loss": loss}
            write_text_atomic(path, json.dumps(saved))
        results.append(saved)
        reporter.advance(1)
    mem = counterfactual_memorization(len(ids), [r["subset"] for r in results],
                                      [r["accuracy"] for r in results])
    ctx.store.write_metric(run.run_id, CF_METRIC, mem[["example_id", "value"]],
                           settings=recipe | {"models": n_models, "definition": "mean token accuracy "
                                              "of models trained with x minus without x"})
    return mem


def _evaluate(model: torch.nn.Module, ids: list[list[int]], batch_size: int, pad: int,
              device: torch.device) -> tuple[list[float], list[float]]:
    """Per example: next-token accuracy under teacher forcing, and the mean NLL."""
    accuracy, loss = [], []
    for _, b, logits in forward_batches(model, ids, pad, batch_size, device):
        target = b.labels[:, 1:]
        valid = target != IGNORE_INDEX
        hits = ((logits[:, :-1].argmax(-1) == target) & valid).sum(1)
        accuracy += (hits / valid.sum(1).clamp(min=1)).double().tolist()
        loss += per_example_lm_loss(logits, b.labels).double().tolist()
    return accuracy, loss
