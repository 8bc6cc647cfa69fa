"""Study: GNQ over a long training run (paper §6.4, Fig. 5–6, Table 4).

1. Regime sweep (``sweep.py``): train a GPT-2 from scratch on AG News at each learning rate of
   the sweep (a checkpoint per epoch, no GNQ), attack the checkpoints of the schedule (the
   paper's epochs 1, 10, …, 100 at paper scale) and pick the (lr, epoch E) where 20–60% of the
   texts are extracted: at the ceiling (95% extracted on an H100 before) or the floor no signal
   can be told from another.
2. Audit that run's schedule checkpoints up to E post hoc on one fixed, seeded batch partition
   (NAME.audit; GNQ_total(x) = the sum over them), and the same checkpoints in three more
   conventions: the per-example token *sum* as ℓ_j (NAME.audit-sum), λ relative to the batch's
   mean K_jj (NAME.audit-rel) and both (NAME.audit-rel-sum).
3. Attack checkpoint E with the fixed-length rule (reveal p tokens, compare exactly the next s,
   success at match ≥ threshold; a text shorter than p + s is not attackable), so every attacked
   text has a target of the same length.
4. Report success per GNQ_total quantile bin (Fig. 6) with intervals, 20 random trajectories
   (Fig. 5), the highest/lowest of them (Table 4), the predictive power of every signal raw and
   within exact token length, and the effect of each convention on the length confound.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.partial import partial_rank_correlation
from gnq_core.analysis.signals import signal_frame
from gnq_core.analysis.summaries import log_trajectory_matrix, quantile_bins
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.settings import AuditSettings, TrainSettings
from gnq_core.sources.datasets import load_texts
from research.studies import report as rep
from research.studies.base import (
    StudyContext,
    Timings,
    ag_news,
    attack_last_point,
    attacked_totals,
    same_settings_or_tag,
    write_dataset,
)
from research.studies.sweep import Rule, choose_regime, lr_folder, run_sweep

STUDY = "trajectories"
BAND = (0.2, 0.6)  # the share of texts extracted that can tell the signals apart


@dataclass(frozen=True)
class Config:
    examples: int           # AG News rows trained on (the first ones with at least min_words words)
    min_words: int
    train: TrainSettings    # lr: the sweep's; epochs: the longest run
    sweep_lrs: tuple[float, ...]
    schedule: tuple[int, ...]  # epochs audited and attacked in the sweep (paper: 1, 10, ..., 100)
    prefix_tokens: int      # p (paper: 45)
    suffix_tokens: int      # s: the fixed-length target
    threshold: float        # paper: 0.98
    bins: int
    plotted: int            # random trajectories drawn (paper: 20)
    rel_lam: float = 1e-2   # c of the relative-λ audits: λ = c · mean K_jj


def audit_epochs(epochs: int, every: int) -> tuple[int, ...]:
    """Every ``every``-th epoch, with the first and the last."""
    return tuple(sorted({1, epochs, *range(every, epochs + 1, every)}))


# CPU (tiny GPT-2): 40 epochs at lr 2e-3 extracted about half of 256 texts before (p = 32, rest of text).
FULL = Config(examples=192, min_words=0, sweep_lrs=(1e-3, 2e-3, 4e-3), schedule=audit_epochs(40, 8),
              prefix_tokens=24, suffix_tokens=16, threshold=0.98, bins=10, plotted=20,
              train=TrainSettings(epochs=40, batch_size=16, lr=2e-3, lam=1e-2, max_length=64, preset="tiny",
                                  vocab_size=1024))
# The paper's §6.4 on a CUDA GPU: GPT-2 small (12×768) from scratch, 500 AG News texts of ≥ 45
# words (so p = 45 leaves a target), 100 epochs, checkpoints 1, 10, …, 100, p = 45, match ≥ 0.98.
# lr: GPT-2 small trained from scratch at 1.5e-4 on an H100 (3e-4 and 6e-4 did not, B 16 T 64).
PAPER = Config(examples=500, min_words=45, sweep_lrs=(5e-5, 1e-4, 1.5e-4), schedule=audit_epochs(100, 10),
               prefix_tokens=45, suffix_tokens=12, threshold=0.98, bins=10, plotted=20,
               train=TrainSettings(epochs=100, batch_size=16, lr=1.5e-4, lam=1e-2, max_length=128,
                                   preset="gpt2-small", vocab_size=8192))
QUICK = Config(examples=32, min_words=0, sweep_lrs=(5e-3, 1e-2), schedule=(1, 4, 8), prefix_tokens=8,
               suffix_tokens=4, threshold=0.98, bins=4, plotted=8,
               train=TrainSettings(epochs=8, batch_size=8, lr=5e-3, lam=1e-2, max_length=32, preset="tiny",
                                   vocab_size=300))
# (suffix, λ mode) of the audits beside the main one (token mean, absolute λ)
VARIANTS = {"audit": ("token_mean", "absolute"), "audit-sum": ("token_sum", "absolute"),
            "audit-rel": ("token_mean", "relative"), "audit-rel-sum": ("token_sum", "relative")}


def run(ctx: StudyContext, prefix_tokens: int | None = None, threshold: float | None = None,
        bins: int | None = None) -> Path:
    cfg = ctx.pick(QUICK, FULL, PAPER)
    cfg = replace(cfg, train=replace(cfg.train, seed=ctx.seed, device=ctx.device),
                  prefix_tokens=prefix_tokens or cfg.prefix_tokens,
                  threshold=cfg.threshold if threshold is None else threshold, bins=bins or cfg.bins)
    if cfg.prefix_tokens + cfg.suffix_tokens > cfg.train.max_length:
        raise ValueError(f"--prefix-tokens {cfg.prefix_tokens} plus the {cfg.suffix_tokens}-token target "
                         f"does not fit in texts cut to {cfg.train.max_length} tokens")
    data_dir = ctx.shared_data()
    store, label, work = ctx.store, ctx.label(STUDY), ctx.work_dir(STUDY)
    timings = Timings(work)
    rows = [r for r in ag_news(data_dir) if len(r[0].split()) >= cfg.min_words][:cfg.examples]
    dataset = load_texts(write_dataset(work / "ag_news.csv", [t for t, _ in rows], [g for _, g in rows]))
    t = cfg.train
    rule = Rule(cfg.prefix_tokens, cfg.suffix_tokens, cfg.threshold)
    with timings.stage("sweep (train + attacks)"), ctx.reporter(f"{label}.sweep") as r:
        sweep = run_sweep(dataset, work, t, cfg.sweep_lrs, list(cfg.schedule), rule, r)
    chosen, inside = choose_regime(sweep, BAND)
    lr, last = float(chosen["lr"]), int(chosen["epoch"])
    series = work / f"series-lr{lr:g}-e{last}"
    series.mkdir(exist_ok=True)
    for e in [e for e in cfg.schedule if e <= last]:
        link = series / f"epoch-{e}"
        if not link.exists():
            os.symlink(Path("..") / lr_folder(work, lr).name / f"epoch-{e}", link, target_is_directory=True)
    audits = {}
    for suffix, (loss, lam_mode) in VARIANTS.items():
        lam = t.lam if lam_mode == "absolute" else cfg.rel_lam
        name = f"{label}.{suffix}"
        with timings.stage(suffix), ctx.reporter(name) as r, same_settings_or_tag():
            audits[suffix] = run_audit(store, series, dataset, name=name, reporter=r, settings=AuditSettings(
                lam=lam, batch_size=t.batch_size, max_length=t.max_length, seed=t.seed, device=t.device,
                loss=loss, lam_mode=lam_mode))
    point = attack_last_point(ctx, audits["audit"], cfg.prefix_tokens, cfg.threshold, timings,
                              suffix_tokens=cfg.suffix_tokens)
    return write_report(ctx, cfg, sweep, (lr, last, inside), audits, point, timings)


def write_report(ctx: StudyContext, cfg: Config, sweep: pd.DataFrame, regime: tuple[float, int, bool],
                 audits: dict, point: pd.Series, timings: Timings) -> Path:
    store, audit = ctx.store, audits["audit"]
    lr, last_epoch, inside = regime
    totals = attacked_totals(store, audit.run_id, int(point["point"]), cfg.prefix_tokens)
    scored = totals[totals["gnq_total"].notna()]
    attacked = scored[scored["extraction_match"].notna()]
    bins = quantile_bins(attacked, bins=cfg.bins, threshold=cfg.threshold)
    bins = rep.with_bin_intervals(bins, attacked, cfg.threshold, ctx.seed)
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
    spearman = rank_corr(attacked["gnq_total"], attacked["extraction_match"])
    spearman_last = rank_corr(attacked["gnq_last"], attacked["extraction_match"])
    success = attacked["extraction_match"] >= cfg.threshold
    per_point = (traj.groupby(["point", "label"])["gnq"].quantile([0.1, 0.5, 0.9]).unstack().reset_index()
                 .rename(columns={0.1: "GNQ 10%", 0.5: "GNQ median", 0.9: "GNQ 90%"}).drop(columns="point"))
    per_point["loss median"] = traj.groupby("point")["loss"].median().to_numpy()

    r = rep.Report(ctx.report_dir(STUDY), "GNQ during training (paper §6.4, Fig. 5–6, Table 4)")
    t = cfg.train
    r.text(rep.scale_banner(ctx, f"GPT-2 ({t.preset} preset)"))
    longer = f" of at least {cfg.min_words} words" if cfg.min_words else ""
    fallback = "" if inside else " — no point of the sweep was inside the band; this is the closest"
    r.text(f"""A GPT-2 ({t.preset} preset, vocabulary {t.vocab_size}, texts cut to {t.max_length} tokens)
is trained from scratch on the first {len(totals)} AG News rows{longer}
(B = {t.batch_size}, a checkpoint per epoch, plain training) at each learning rate of the sweep. The
sweep attacks the checkpoints of epochs {', '.join(map(str, cfg.schedule))} and picks the (lr, epoch)
whose extracted share is inside {BAND[0]:.0%}–{BAND[1]:.0%} and closest to its middle (the rate only;
no signal is looked at). Chosen: lr {lr:g}, epoch {last_epoch}{fallback}.
Its checkpoints {', '.join(labels)} are audited post hoc on one fixed, seeded batch partition (run
`{audit.name}`, λ = {t.lam:g}, per-example token-mean loss); GNQ_total(x) is the sum of x's GNQ over
them. The attack on {point['label']} reveals p = {cfg.prefix_tokens} tokens and compares exactly the next
s = {cfg.suffix_tokens} (greedy), success at match ≥ {cfg.threshold:g}; a text shorter than p + s is not
attacked, so every attacked text has a target of the same length (paper: p = 45, the rest of the text,
0.98). Intervals: 95% percentile bootstrap, {pr.RESAMPLES} resamples, seed {ctx.seed}.""")

    r.text("## Regime sweep")
    show = sweep.assign(**{"extracted [95% CI]": [f"{a:.2f} [{b:.2f}, {c:.2f}]" for a, b, c in
                                                   zip(sweep["rate"], sweep["rate lo"], sweep["rate hi"],
                                                       strict=True)]})
    grid = show.pivot(index="epoch", columns="lr", values="extracted [95% CI]").reset_index()
    grid.columns = ["epoch"] + [f"lr {c:g}" for c in grid.columns[1:]]
    r.table(grid, caption=f"Share of the attackable texts extracted (p = {cfg.prefix_tokens}, s = "
                          f"{cfg.suffix_tokens}, match ≥ {cfg.threshold:g}) per learning rate and epoch.")

    r.text("## Result")
    rate, rate_lo, rate_hi = pr.rate_interval(success.to_numpy(), seed=ctx.seed)
    rates = bins["success_rate"].tolist() or [np.nan]
    r.text(f"""- {len(attacked)} texts attacked, {int(success.sum())} extracted
  ({rep.ci(rate, rate_lo, rate_hi, '.3f')}).
- Success rate in the highest GNQ_total bin {rep.fmt(rates[-1])}, in the lowest {rep.fmt(rates[0])};
  Spearman correlation of GNQ_total with the match fraction {rep.fmt(spearman)}.
- Concentration: the top 10% of texts by GNQ_total hold {rep.fmt(share_top10)} of all GNQ_total
  (an even spread would be 0.100).
- {_trend(spearman, spearman_last, labels[-1])}""")
    r.table(bins.drop(columns=["example_ids"]), {"lo": ".4g", "hi": ".4g", "mean_score": ".4g"},
            caption=f"Attack success per GNQ_total quantile bin (Fig. 6): {cfg.bins} bins, 1 = lowest; "
                    "rate lo/hi: 95% Wilson interval.")
    r.figure(rep.quantile_bars(bins, title="Extraction success per GNQ_total quantile bin",
                               score_label="GNQ_total"), "success_by_bin.png",
             f"Bars: success rate (p = {cfg.prefix_tokens}, s = {cfg.suffix_tokens}, "
             f"match ≥ {cfg.threshold:g}); "
             "line: mean GNQ_total per bin (Fig. 6).")
    r.figure(rep.trajectory_lines(matrix, labels,
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
            caption="GNQ and loss over all texts per checkpoint.")
    frame = signal_frame(store, audit, totals)
    results = {"bins": bins.drop(columns=["example_ids"]), "spearman": spearman,
               "spearman_last": spearman_last, "share_top10": share_top10, "extracted_rate": rate,
               "extracted_rate_ci": [rate_lo, rate_hi], "sweep": sweep,
               "regime": {"lr": lr, "epoch": last_epoch, "inside_band": inside},
               "attacked": len(attacked), "extracted": int(success.sum()), "config": asdict(cfg),
               "runs": [a.name for a in audits.values()], "plotted": picked}
    results |= rep.predictive_section(
        r, frame, filename="predictive_roc.png", seed=ctx.seed,
        what=f"The attack on {point['label']} (p = {cfg.prefix_tokens}, s = {cfg.suffix_tokens}, match ≥ "
             f"{cfg.threshold:g}); GNQ post hoc over the audited checkpoints.")
    conventions = convention_table(store, audits, frame, ctx.seed)
    r.text("## The loss convention and λ: length confound and predictive power")
    r.text(f"""The same checkpoints audited four ways: ℓ_j the token mean (as above) or the token sum, and λ
absolute ({t.lam:g}) or relative to each batch's mean K_jj (λ = {cfg.rel_lam:g} · mean K_jj, scale-free). The
token sum multiplies each gradient by its text's length n_j; the relative λ removes the batch's overall
gradient scale (e.g. its collapse once the texts are memorised). Spearman with length: correlation of
GNQ_total with the token count over all texts (0: no length confound).""")
    r.table(conventions.drop(columns=[c for c in conventions.columns if c.startswith("_")]),
            caption="Per convention: GNQ_total's rank correlation with text length, and its AUC for the "
                    "attack's outcome over all attacked texts and within exact token length "
                    "(pair-weighted), 95% intervals.")
    r.text(conventions_sentence(conventions))
    results["conventions"] = conventions
    r.text("## The paper's claims (Fig. 5, Fig. 6, Table 4) and this run")
    r.text(paper_paragraphs(share_top10, bins, spearman, table4, frame, ctx.seed))
    r.text(EARLIER_GPU)
    return r.write(results, command=ctx.command, timings=timings, device=ctx.device)


def rank_corr(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ (average ranks); NaN when either side is constant."""
    rx = pd.Series(np.asarray(x, dtype=float)).rank().to_numpy()
    ry = pd.Series(np.asarray(y, dtype=float)).rank().to_numpy()
    if len(rx) < 2 or rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_interval(x: np.ndarray, y: np.ndarray, seed: int,
                      groups: np.ndarray | None = None) -> tuple[float, float, float]:
    """Spearman's ρ with a 95% interval over records (copy clusters ``groups`` resampled together,
    expanded for few records: ``analysis.partial`` without covariates); NaN parts where ρ has no
    value (e.g. every text has one length)."""
    p = partial_rank_correlation(np.asarray(x, float), np.asarray(y, float), [], groups=groups,
                                 resamples=pr.RESAMPLES, seed=seed)
    return p.r, p.lo, p.hi


def convention_table(store, audits: dict, frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Per audit convention: Spearman(GNQ_total, n_tokens) and GNQ_total's raw and length-stratified
    AUC against the main attack's outcome (the same texts and outcome for every convention)."""
    outcome = frame[["example_id", "extracted", "n_tokens"]]
    rows = []
    for suffix, (loss, lam_mode) in VARIANTS.items():
        run = audits[suffix]
        totals = store.example_totals(run.run_id)[["example_id", "gnq_total"]]
        f = outcome.merge(totals, on="example_id", how="left")
        rho, lo, hi = spearman_interval(f["gnq_total"].to_numpy(float), f["n_tokens"].to_numpy(float), seed,
                                        cl.groups_of(frame))
        attacked = f[f["extracted"].notna()].reset_index(drop=True)
        row = pr.stratified_table(attacked, [pr.SIGNAL_BY_COLUMN["gnq_total"]], seed=seed).iloc[0]
        rows.append({"run": run.name, "loss": loss, "λ": lam_mode,
                     "Spearman with length": rep.ci(rho, lo, hi),
                     "AUC (all texts)": rep.ci(row.get("auc"), row.get("auc lo"), row.get("auc hi")),
                     "AUC within exact length": rep.ci(row.get("stratified auc"), row.get("stratified lo"),
                                                      row.get("stratified hi")),
                     "_rho": rho, "_auc": row.get("auc"), "_stratified": row.get("stratified auc"),
                     "_stratified_lo": row.get("stratified lo")})
    return pd.DataFrame(rows)


def conventions_sentence(conventions: pd.DataFrame) -> str:
    """What the four conventions did, in words chosen by the numbers."""
    c = conventions.set_index("run")
    rho = {f"{r['loss']}, λ {r['λ']}": r["_rho"] for _, r in c.iterrows()}
    spread = ", ".join(f"{k} {rep.fmt(v, '.2f')}" for k, v in rho.items())
    best = c["_stratified"].astype(float)
    above = [f"{r['loss']}, λ {r['λ']}" for _, r in c.iterrows() if float(r["_stratified_lo"]) > 0.5]
    within = ("no convention gives GNQ_total a within-length AUC whose interval lies above 0.5" if not above
              else "within exact length GNQ_total's interval lies above 0.5 for " + ", ".join(above))
    return (f"Spearman of GNQ_total with length: {spread}. Within exact length the AUCs range "
            f"{rep.fmt(best.min(), '.2f')}–{rep.fmt(best.max(), '.2f')}; {within}.")


def paper_paragraphs(share_top10: float, bins: pd.DataFrame, spearman: float, table4: pd.DataFrame,
                     frame: pd.DataFrame, seed: int) -> str:
    """Fig. 5, Fig. 6 and Table 4: ours next to the paper's, with the rule that decides each."""
    fig5 = share_top10 > 0.2
    rates = bins["success_rate"].to_numpy(float)
    order = np.arange(1, len(rates) + 1)
    rising = rank_corr(order, rates) if len(rates) > 2 else np.nan
    top, lo_top = (rates[-1], bins["rate lo"].iloc[-1]) if len(rates) else (np.nan, np.nan)
    bottom, hi_bottom = (rates[0], bins["rate hi"].iloc[0]) if len(rates) else (np.nan, np.nan)
    fig6 = bool(lo_top > hi_bottom) and rising > 0.5
    attacked = frame[frame["extracted"].notna()].reset_index(drop=True)
    strat = pr.stratified_table(attacked, [pr.SIGNAL_BY_COLUMN["gnq_total"]], seed=seed).iloc[0]
    fig6_verdict = "reproduced" if fig6 else "not reproduced"
    fig5_verdict = ("reproduced (GNQ concentrates on a minority)" if fig5
                    else "not reproduced (GNQ is spread evenly)")
    raw = rep.ci(strat.get("auc"), strat.get("auc lo"), strat.get("auc hi"))
    within = rep.ci(strat.get("stratified auc"), strat.get("stratified lo"), strat.get("stratified hi"))
    high = table4[table4["trajectory"].str.startswith("High")]["avg GNQ"].to_numpy(float)
    low = table4[table4["trajectory"].str.startswith("Low")]["avg GNQ"].to_numpy(float)
    ratio = float(high.min() / low.max()) if len(high) and len(low) and low.max() > 0 else np.nan
    return f"""**Fig. 5 (trajectories).** Paper: GNQ trajectories of 20 random texts are heterogeneous, two
grow sharply and stay high, the rest stay low. Here the top 10% of texts hold {share_top10:.3f} of all
GNQ_total (0.100 if even). Verdict: {fig5_verdict}.
Rule: the top 10% hold more than 0.2 of GNQ_total.

**Fig. 6 (success per GNQ_total bin).** Paper: success rises with the GNQ_total bin ("strongly
correlated"), the top bin 70% and the next ~90%. Here: lowest bin {rep.fmt(bottom)} (interval up to
{rep.fmt(hi_bottom)}), highest bin {rep.fmt(top)} (from {rep.fmt(lo_top)}); rank correlation of bin and
success {rep.fmt(rising)}; Spearman of GNQ_total with the match fraction {rep.fmt(spearman)}; GNQ_total's
AUC {raw} over all attacked texts and {within} within exact token length. Verdict: {fig6_verdict}. Rule: the
highest bin's interval lies above the
lowest bin's and success rises with the bin (rank correlation > 0.5).

**Table 4 (high vs. low trajectories).** Paper: average GNQ 12972.5 and 5333.9 for the two highest,
542.7 and 551.4 for the two lowest (≥ 9.7× apart). Here: {', '.join(f'{v:.1f}' for v in high)} vs.
{', '.join(f'{v:.1f}' for v in low)} (the lower high is {rep.fmt(ratio)}× the higher low). Verdict:
{'reproduced' if ratio >= 5 else 'not reproduced'} (rule: at least 5× apart; the texts differ, the spread is
the claim)."""


EARLIER_GPU = """## Earlier GPU measurements (H100, other sessions)

Quoted from `../shared/perf/` (measured by earlier sessions on an NVIDIA H100 80 GB, not rerun here):

- `gpu-trajectories-gpt2s-lr1.5e-4-28ep.txt`: GPT-2 small (12×768) from scratch on 512 AG News texts,
  T 64, lr 1.5e-4, 28 epochs, 11 audited checkpoints, p = 32 (rest of the text), match ≥ 0.98: 406 of
  425 extracted (0.955, at the ceiling); success by GNQ_total decile 1.000 0.952 0.977 1.000 0.977
  1.000 0.953 0.952 0.953 0.786 — the top decile is the least extracted. Median GNQ rose to ~12k while
  the loss fell from 6 to 1.8, then collapsed to ~60 once texts were memorised. lr 3e-4 and 6e-4: 2%
  extracted.
- `gpu-verdict-experiment.md`: GPT-2 small, 1000 AG News + 80 planted secrets, T 64, lr 1.5e-4, 30
  epochs, in-run GNQ (221 s), p = 16, match ≥ 0.98. At epoch 10 (266 of 1000 news texts extracted, the
  only checkpoint inside 20–60%): AUC GNQ_total 0.796, loss 0.840, loss ratio 0.857, text length alone
  0.925; Spearman(GNQ_total, length) −0.68 with the token mean, +0.88 with the token sum (AUC 0.074).
  Within length bins GNQ_total's AUC was 0.71, 0.38, 0.23, 0.02, 0.03 (shortest to longest bin) vs.
  loss 0.71–0.96. No intervals were computed there."""


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
