"""Study: GNQ over a long training run (paper §6.4, Fig. 5–6, Table 4).

Train a small GPT-2 from scratch for many epochs on an AG News subset (run NAME.train, a
checkpoint per epoch), audit a series of those checkpoints post hoc on one fixed, seeded batch
partition (NAME.audit), sum each text's GNQ over the checkpoints (GNQ_total), attack the final
checkpoint with a prefix-completion attack (p tokens revealed, success at match ≥ threshold) and
report the success rate per GNQ_total quantile bin, the trajectories of 20 random texts, and the
highest/lowest of them.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis.signals import signal_frame
from gnq_core.analysis.studies import report as rep
from gnq_core.analysis.studies.base import (
    StudyContext,
    Timings,
    ag_news,
    attack_last_point,
    attacked_totals,
    same_settings_or_tag,
    write_dataset,
)
from gnq_core.analysis.summaries import log_trajectory_matrix, quantile_bins
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings, TrainSettings
from gnq_core.pipelines.train import run_training
from gnq_core.sources.datasets import load_texts

STUDY = "trajectories"


@dataclass(frozen=True)
class Config:
    examples: int           # AG News rows trained on (the first ones of the 2,000-row slice)
    train: TrainSettings
    audit_every: int        # audit epoch 1 and every audit_every-th epoch (and the last)
    prefix_tokens: int      # the paper's p = 45 on ~100-token texts; scaled to max_length here
    threshold: float
    bins: int
    plotted: int            # random trajectories drawn (paper: 20)


# 40 epochs: the final checkpoint extracts about half the texts (probed: 5% after 32 epochs, 52%
# after 40, 87% after 44, all after 48), so success can differ between GNQ_total bins.
FULL = Config(examples=256, audit_every=4, prefix_tokens=32, threshold=0.98, bins=10, plotted=20,
              train=TrainSettings(epochs=40, batch_size=16, lr=2e-3, lam=1e-2, max_length=64, preset="tiny",
                                  vocab_size=1024))
QUICK = Config(examples=32, audit_every=2, prefix_tokens=12, threshold=0.98, bins=4, plotted=8,
               train=TrainSettings(epochs=4, batch_size=8, lr=3e-3, lam=1e-2, max_length=32, preset="tiny",
                                   vocab_size=300))


def audit_epochs(epochs: int, every: int) -> list[int]:
    return sorted({1, epochs, *range(every, epochs + 1, every)})


def run(ctx: StudyContext, prefix_tokens: int | None = None, threshold: float | None = None,
        bins: int | None = None) -> Path:
    cfg = QUICK if ctx.quick else FULL
    cfg = replace(cfg, train=replace(cfg.train, seed=ctx.seed, device=ctx.device),
                  prefix_tokens=prefix_tokens or cfg.prefix_tokens,
                  threshold=cfg.threshold if threshold is None else threshold, bins=bins or cfg.bins)
    if cfg.prefix_tokens >= cfg.train.max_length:
        raise ValueError(f"--prefix-tokens {cfg.prefix_tokens} leaves nothing to extract from texts cut "
                         f"to {cfg.train.max_length} tokens")
    data_dir = ctx.shared_data()
    store, label, work = ctx.store, ctx.label(STUDY), ctx.work_dir(STUDY)
    timings = Timings(work)
    rows = ag_news(data_dir, cfg.examples)
    dataset = load_texts(write_dataset(work / "ag_news.csv", [t for t, _ in rows], [g for _, g in rows]))
    t = cfg.train
    train_name, audit_name = f"{label}.train", f"{label}.audit"
    with timings.stage("train"), ctx.reporter(train_name) as r, same_settings_or_tag():
        trained = run_training(store, dataset, work / "train", name=train_name, settings=t, reporter=r)
    series = work / "series"
    series.mkdir(exist_ok=True)
    for e in audit_epochs(t.epochs, cfg.audit_every):
        link = series / f"epoch-{e}"
        if not link.exists():
            os.symlink(Path("..") / "train" / f"epoch-{e}", link, target_is_directory=True)
    with timings.stage("audit"), ctx.reporter(audit_name) as r, same_settings_or_tag():
        audit = run_audit(store, series, dataset, name=audit_name, reporter=r,
                          settings=AuditSettings(lam=t.lam, batch_size=t.batch_size, max_length=t.max_length,
                                                 seed=t.seed, device=t.device))
    point = attack_last_point(ctx, audit, cfg.prefix_tokens, cfg.threshold, timings)
    return write_report(ctx, cfg, trained, audit, point, timings)


def write_report(ctx: StudyContext, cfg: Config, trained, audit, point: pd.Series, timings: Timings) -> Path:
    store = ctx.store
    totals = attacked_totals(store, audit.run_id, int(point["point"]), cfg.prefix_tokens)
    scored = totals[totals["gnq_total"].notna()]
    attacked = scored[scored["extraction_match"].notna()]
    bins = quantile_bins(attacked, bins=cfg.bins, threshold=cfg.threshold)
    traj = store.trajectories(audit.run_id)
    labels = list(dict.fromkeys(traj.sort_values("point")["label"]))
    rng = np.random.default_rng(ctx.seed)
    picked = sorted(rng.choice(scored["example_id"].to_numpy(), size=min(cfg.plotted, len(scored)),
                               replace=False).tolist())
    matrix = 10 ** log_trajectory_matrix(traj[traj["example_id"].isin(picked)])
    avg = matrix.mean(axis=1).sort_values(ascending=False)
    high, low = avg.index[:2].tolist(), avg.index[::-1][:2].tolist()
    totals_sorted = np.sort(scored["gnq_total"].to_numpy())[::-1]
    top10 = max(1, int(round(0.1 * len(totals_sorted))))
    share_top10 = float(totals_sorted[:top10].sum() / totals_sorted.sum())
    spearman = float(attacked["gnq_total"].rank().corr(attacked["extraction_match"].rank()))
    spearman_last = float(attacked["gnq_last"].rank().corr(attacked["extraction_match"].rank()))
    success = attacked["extraction_match"] >= cfg.threshold
    per_point = (traj.groupby(["point", "label"])["gnq"].quantile([0.1, 0.5, 0.9]).unstack().reset_index()
                 .rename(columns={0.1: "GNQ 10%", 0.5: "GNQ median", 0.9: "GNQ 90%"}).drop(columns="point"))

    r = rep.Report(ctx.report_dir(STUDY), "GNQ during training (paper §6.4, Fig. 5–6, Table 4)")
    t = cfg.train
    r.text(f"""A small GPT-2 ({t.preset} preset, vocabulary {t.vocab_size}, texts cut to {t.max_length}
tokens) is trained from scratch for {t.epochs} epochs on the first {len(totals)} rows of AG News
(run `{trained.name}`, a checkpoint per epoch, lr {t.lr:g}, B = {t.batch_size}). Checkpoints
{', '.join(labels)} are audited post hoc on one fixed, seeded batch partition (run `{audit.name}`,
λ = {t.lam:g}); GNQ_total(x) is the sum of x's GNQ over them. The final checkpoint
({point['label']}) is attacked: reveal p = {cfg.prefix_tokens} tokens, greedy-decode the rest,
success at match ≥ {cfg.threshold:g} (paper: p = 45 of longer texts, 0.98). The run's Trajectories
and Extraction pages on the dashboard show the same data.""")
    r.text("## Result")
    rates = bins["success_rate"].tolist() or [np.nan]
    top, bottom = rates[-1], rates[0]
    rate = float(success.mean()) if len(success) else np.nan
    r.text(f"""- {len(attacked)} texts attacked, {int(success.sum())} extracted ({rep.fmt(rate)}).
- Success rate in the highest GNQ_total bin {rep.fmt(top)}, in the lowest {rep.fmt(bottom)}; Spearman
  correlation of GNQ_total with the match fraction {rep.fmt(spearman)}.
- Concentration: the top 10% of texts by GNQ_total hold {rep.fmt(share_top10)} of all GNQ_total
  (an even spread would be 0.100).
- {_trend(spearman, spearman_last, labels[-1])}""")
    r.table(bins.drop(columns=["example_ids"]), {"lo": ".4g", "hi": ".4g", "mean_score": ".4g"},
            caption=f"Attack success per GNQ_total quantile bin (Fig. 6): {cfg.bins} bins, 1 = lowest.")
    r.figure(rep.quantile_bars(bins, title="Extraction success per GNQ_total quantile bin",
                               score_label="GNQ_total"), "success_by_bin.png",
             f"Bars: success rate (p = {cfg.prefix_tokens}, match ≥ {cfg.threshold:g}); line: mean GNQ_total "
             "per bin (Fig. 6).")
    r.figure(rep.trajectory_lines(matrix[labels_to_points(traj, labels)], labels,
                                  title=f"GNQ trajectories of {len(picked)} random training texts",
                                  highlight=high), "trajectories.png",
             f"GNQ per checkpoint for {len(picked)} random texts; the two highest on average in bold "
             "(Fig. 5).")
    text_of = dict(zip(totals["example_id"], totals["text"], strict=True))
    match_of = dict(zip(totals["example_id"], totals["extraction_match"], strict=True))
    table4 = pd.DataFrame([{"trajectory": f"{kind} #{i + 1}", "example": int(e), "avg GNQ": avg[e],
                            "match": match_of[e], "text": rep.fmt(text_of[e])[:240]}
                           for kind, ids in (("High", high), ("Low", low)) for i, e in enumerate(ids)])
    r.table(table4, {"avg GNQ": ".1f", "match": ".2f"},
            caption="Table 4: the two highest and two lowest average-GNQ trajectories among the plotted "
                    "texts.")
    r.table(per_point, {c: ".4g" for c in per_point.columns if c != "label"},
            caption="GNQ over all texts per checkpoint.")
    results = {"bins": bins.drop(columns=["example_ids"]), "spearman": spearman,
               "spearman_last": spearman_last, "share_top10": share_top10,
               "attacked": len(attacked), "extracted": int(success.sum()), "config": asdict(cfg),
               "runs": [trained.name, audit.name], "plotted": picked}
    results |= rep.predictive_section(
        r, signal_frame(store, audit, totals), filename="predictive_roc.png", seed=ctx.seed,
        what=f"The attack on {point['label']} (p = {cfg.prefix_tokens}, match ≥ {cfg.threshold:g}); GNQ "
             f"post hoc over the audited checkpoints, GNQ in-run from `{trained.name}`.")
    return r.write(results, command=ctx.command, timings=timings)


def _trend(spearman: float, spearman_last: float, last: str) -> str:
    if np.isnan(spearman):
        return "Every attacked text had the same outcome: no relation to GNQ_total can show."
    if abs(spearman) < 0.1:
        return (f"Attack success does not change with GNQ_total on this model (Spearman {rep.fmt(spearman)}; "
                "the paper's Fig. 6 rises with it).")
    if spearman > 0:
        return (f"Attack success rises with GNQ_total (Spearman {rep.fmt(spearman)}), as in the paper's "
                "Fig. 6.")
    text = (f"Attack success *falls* with GNQ_total on this model (Spearman {rep.fmt(spearman)}), unlike "
            f"the paper's Fig. 6. GNQ at {last} alone gives Spearman {rep.fmt(spearman_last)}")
    if spearman_last < spearman:
        text += (": a text the model already reproduces has a small gradient, hence a small GNQ, at the "
                 "late checkpoints, while the texts still being learned keep large ones")
    return text + "."


def labels_to_points(traj: pd.DataFrame, labels: list[str]) -> list[int]:
    """Matrix columns (points) in the order of ``labels``."""
    point_of = dict(zip(traj["label"], traj["point"], strict=False))
    return [point_of[label] for label in labels]
