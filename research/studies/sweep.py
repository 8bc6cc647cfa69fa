"""The regime sweep: train the same model at several learning rates (a checkpoint per epoch, no
GNQ), attack the checkpoints of a schedule, and pick the (lr, epoch) where a share of the texts
inside the target band is extracted — so the outcome is neither at the floor nor at the ceiling
and the signals can be told apart.  The pick looks at the extraction *rate* only, never at how
any signal ranks the texts (no ranking is tuned to the outcome it is scored against)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import predictive as pr
from gnq_core.attacks.extraction import extraction_attack
from gnq_core.common.atomic import write_text_atomic
from gnq_core.common.runtime import resolve_device
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import TextDataset
from gnq_core.sources.tokens import encode_texts
from research.studies.common_knowledge import pretrain

SWEEP_FILE = "sweep.json"


@dataclass(frozen=True)
class Rule:
    prefix_tokens: int
    suffix_tokens: int
    threshold: float


def lr_folder(work: Path, lr: float) -> Path:
    return work / f"lr-{lr:g}"


def choose_regime(rates: pd.DataFrame, band: tuple[float, float]) -> tuple[pd.Series, bool]:
    """The row of ``rates`` (columns lr, epoch, rate) whose rate is inside ``band`` and closest to
    its middle; when no row is inside, the row closest to the band.  Ties: the later epoch (a
    longer trajectory), then the smaller lr.  Returns (row, inside)."""
    lo, hi = band
    if rates.empty:
        raise ValueError("the sweep has no attacked checkpoint")
    r = rates.assign(inside=rates["rate"].between(lo, hi),
                     distance=np.where(rates["rate"].between(lo, hi), (rates["rate"] - (lo + hi) / 2).abs(),
                                       np.minimum((rates["rate"] - lo).abs(), (rates["rate"] - hi).abs())))
    r = r.sort_values(["inside", "distance", "epoch", "lr"], ascending=[False, True, False, True],
                      kind="mergesort")
    best = r.iloc[0]
    return best, bool(best["inside"])


def run_sweep(dataset: TextDataset, work: Path, settings: TrainSettings, lrs: tuple[float, ...],
              epochs: list[int], rule: Rule, reporter) -> pd.DataFrame:
    """Train one plain run per lr (resumes) and attack each epoch of ``epochs``; the attacks are
    kept in ``work``/sweep.json (recomputed when the rule or the data change).  Columns: lr,
    epoch, attacked, extracted, rate, rate lo, rate hi (95% Wilson)."""
    path = work / SWEEP_FILE
    key = {"rule": asdict(rule), "dataset": dataset.sha256,
           "settings": {k: v for k, v in asdict(settings).items() if k not in ("device", "lr")}}
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    rates: dict[str, list[int]] = saved.get("rates", {}) if saved.get("key") == key else {}
    rows = []
    for lr in lrs:
        folder = lr_folder(work, lr)
        pretrain(dataset, folder, replace(settings, lr=lr), reporter, keep=set(epochs))
        for e in epochs:
            name = f"{lr:g}/{e}"
            if name not in rates:
                rates[name] = attack_counts(folder / f"epoch-{e}", dataset, settings, rule, reporter)
                write_text_atomic(path, json.dumps({"key": key, "rates": rates}, indent=1))
            extracted, attacked = rates[name]
            rate, lo, hi = pr.rate_interval(np.arange(attacked) < extracted, seed=settings.seed)
            rows.append({"lr": lr, "epoch": e, "attacked": attacked, "extracted": extracted, "rate": rate,
                         "rate lo": lo, "rate hi": hi})
    return pd.DataFrame(rows)


def attack_counts(checkpoint: Path, dataset: TextDataset, settings: TrainSettings, rule: Rule,
                  reporter) -> list[int]:
    """[extracted, attacked] of the fixed-length prefix attack on one checkpoint (texts shorter
    than p + s are not attackable)."""
    device = resolve_device(settings.device)
    model, tokenizer = load_checkpoint(checkpoint, device=device)
    ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
    reporter.stage(f"sweep attack {checkpoint.parent.name}/{checkpoint.name}", len(ids))
    results = extraction_attack(model, tokenizer, ids, list(range(len(ids))),
                                prefix_tokens=rule.prefix_tokens, threshold=rule.threshold, batch_size=64,
                                suffix_tokens=rule.suffix_tokens, device=device, progress=reporter.advance)
    done = [r for r in results if not r.skipped]
    return [int(sum(bool(r.success) for r in done)), len(done)]
