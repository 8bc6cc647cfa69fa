"""Study: which texts does a targeted prefix-completion attack extract? (paper §6.3, Table 3)

On the fine-tuned model of the common-knowledge study (built or resumed first): reveal the first
p = 12 tokens of each of the facts and claims, greedy-decode the rest, and count an exact match
as extracted.  Then pick the top 5/10/20% of texts by GNQ (max over the fine-tuning epochs, as
the paper), by counterfactual memorization, by loss (lowest first, the membership-inference
pick) and by self-influence K_jj, and k random texts (several seeded trials); report how many of
each pick were extracted and from which group.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.signals import signal_frame
from gnq_core.analysis.summaries import group_auc, quantile_bins, targeted_rows
from research.studies import common_knowledge as ck
from research.studies import report as rep
from research.studies.base import StudyContext, Timings, attack_last_point, attacked_totals
from research.studies.counterfactual import CF_METRIC

STUDY = "extraction"
FRACTIONS = (0.05, 0.10, 0.20)
STRATEGIES = [("GNQ (max over epochs)", "gnq_max", True),
              ("GNQ (last epoch)", "gnq_last", True),
              ("Counterfactual memorization", CF_METRIC, True),
              ("Loss (lowest, last epoch)", "loss_last", False),
              ("Self-influence K_jj (last epoch)", "self_influence_last", True)]


def run(ctx: StudyContext, facts: Path | None = None, claims: Path | None = None,
        cf_models: int | None = None, prefix_tokens: int | None = None, threshold: float = 1.0,
        random_trials: int | None = None) -> Path:
    prefix_tokens = prefix_tokens or ctx.pick(4, 8, 12)  # the paper's p = 12 on its longer sentences
    prep = ck.prepare(ctx, facts, claims, cf_models)
    timings = Timings(ctx.work_dir(STUDY))
    trials = random_trials if random_trials is not None else (3 if ctx.quick else 5)
    if trials < 1:
        raise ValueError("--random-trials must be at least 1")
    run_ = prep.finetune
    point = attack_last_point(ctx, run_, prefix_tokens, threshold, timings)
    totals = attacked_totals(ctx.store, run_.run_id, int(point["point"]), prefix_tokens)
    attacked = totals[totals["extraction_match"].notna()].copy()
    attacked["success"] = attacked["extraction_match"] >= threshold
    table = with_rate_intervals(targeted_rows(attacked, STRATEGIES, FRACTIONS, threshold=threshold,
                                              random_trials=trials, seed=ctx.seed), ctx.seed)

    r = rep.Report(ctx.report_dir(STUDY), "Targeted extraction by GNQ (paper §6.3, Table 3)")
    r.text(rep.scale_banner(ctx, f"GPT-2 ({prep.config.pretrain.preset} preset), pretrained and fine-tuned"))
    r.text(f"""The model is the fine-tuned GPT-2 of the common-knowledge study (run `{run_.name}`,
checkpoint `{point['label']}`). Attack: reveal the first p = {prefix_tokens} tokens of each training
text, greedy-decode the rest, success when the match fraction of the continuation is at least
{threshold:g}{' (exact match)' if threshold >= 1 else ''}. {len(attacked)} of {len(totals)} texts are long
enough to attack. Budgets are fractions of the attacked texts; GNQ is each text's maximum over the
{prep.config.finetune.epochs} fine-tuning epochs (in-run, as the paper), counterfactual
memorization comes from {prep.config.cf_models} subset models. The run's Extraction page on the
dashboard shows the same attack.""")
    by_group = (attacked.groupby("group").agg(texts=("example_id", "size"), extracted=("success", "sum"))
                .reset_index())
    by_group["rate"] = by_group["extracted"] / by_group["texts"]
    intervals = [pr.rate_interval(part["success"].to_numpy(), seed=ctx.seed)[1:]
                 for _, part in attacked.groupby("group")]
    by_group["rate lo"], by_group["rate hi"] = [i[0] for i in intervals], [i[1] for i in intervals]
    aucs = predictive_auc(attacked)
    overall, rate_lo, rate_hi = pr.rate_interval(attacked["success"].to_numpy())
    r.text("## Result")
    r.text(_verdict(table, overall) + "\n" + _reading(by_group, aucs, prep.words is not None))
    r.text("## The paper's claim (Table 3) and this run")
    r.text(paper_paragraph(table, (overall, rate_lo, rate_hi)))
    r.text(EARLIER)
    show = table.assign(Budget=[("top-" if not t.startswith("Random") else "") + f"{f:.0%}"
                                for t, f in zip(table["target"], table["fraction"], strict=True)])
    show = show.rename(columns={"target": "Target set", "k": "k", "extracted": "Extracted",
                                "groups": "Group breakdown", "rate_ci": "Rate [95% CI]"})[
        ["Target set", "Budget", "k", "Extracted", "Group breakdown", "Rate [95% CI]"]]
    r.table(show, caption=f"Targeted prefix-completion exact recovery (n = {len(attacked)}; paper Table 3 "
                          "layout). Random: seeded trials.")
    r.text("### Per group")
    r.table(by_group, {"rate": ".3f"}, caption=f"Overall: {int(attacked['success'].sum())} of "
                                               f"{len(attacked)} extracted ({rep.fmt(overall)}).")
    randoms = table[table["target"].str.startswith("Random")]
    summary = (table[~table["target"].str.startswith("Random")][["target", "fraction", "rate"]]
               .pivot(index="target", columns="fraction", values="rate"))
    summary.loc[f"Random (mean of {trials})"] = randoms.groupby("fraction")["rate"].mean()
    summary = summary.reset_index()
    summary.columns = ["target"] + [f"rate top-{f:.0%}" for f in summary.columns[1:]]
    r.table(summary, caption="Share extracted among each pick.")
    bars = table[~table["target"].str.startswith("Random")]
    bars = pd.concat([bars, randoms.groupby("fraction", as_index=False)["rate"].mean()
                      .assign(target=f"Random (mean of {trials})")], ignore_index=True)
    r.figure(rep.strategy_bars(bars, title="Extracted among the top-k of each ranking"), "targeted.png",
             "Share of each pick that the attack extracts.")
    r.text("### Does a score tell the extracted texts from the others?")
    r.table(predictive_auc(attacked, ctx.seed),
            caption="AUC [95% interval over copy clusters; too few under 10 records] of each score for "
                    "extracted vs. not extracted texts "
                    "(1: every extracted text scores higher; 0.5: no information; below 0.5: lower). "
            "Loss is negated (low loss ranks high), as in its pick above.")
    bins = quantile_bins(attacked, bins=5 if len(attacked) >= 20 else 2, threshold=threshold, score="gnq_max")
    bins = rep.with_bin_intervals(bins, attacked, threshold, ctx.seed)
    if not bins.empty:
        r.figure(rep.quantile_bars(bins, title="Attack success per GNQ quantile bin", score_label="GNQ max"),
                 "success_by_gnq_bin.png", "Attack success per quantile bin of GNQ (max over epochs).")
        r.table(bins.drop(columns=["example_ids"]), {"lo": ".4g", "hi": ".4g", "mean_score": ".4g"},
                caption="Quantile bins of GNQ (max over epochs).")
    results = {"table": table, "by_group": by_group, "overall_rate": overall,
               "overall_rate_ci": [rate_lo, rate_hi], "attacked": len(attacked),
               "prefix_tokens": prefix_tokens, "threshold": threshold, "run": run_.name,
               "checkpoint": str(point["label"])}
    results |= rep.predictive_section(
        r, signal_frame(ctx.store, run_, totals), filename="predictive_roc.png", seed=ctx.seed,
        what=f"This attack (p = {prefix_tokens}, match ≥ {threshold:g}); GNQ is in-run, over the fine-tuning "
             "epochs.")
    timings.data |= {f"common-knowledge: {k}": v for k, v in prep.timings.data.items()}
    return r.write(results, command=ctx.command, timings=timings, device=ctx.device)


# The paper's Table 3 (n = 400): extracted / k per pick.
PAPER_TABLE3 = {("GNQ", 0.05): (20, 20), ("GNQ", 0.10): (35, 40), ("GNQ", 0.20): (64, 80),
                ("Counterfactual", 0.05): (7, 20), ("Counterfactual", 0.10): (19, 40),
                ("Counterfactual", 0.20): (41, 80)}


EARLIER = """Earlier runs of this study (quoted from the notes and the reports at commit d876b60; CPU, tiny
GPT-2, the older design with the facts mixed into pretraining verbatim, no intervals): the top
5/10/20% by GNQ were extracted at 0.375/0.375/0.453, random picks at 0.525/0.456/0.553 — GNQ picked
worse than chance there. No GPU run of this study exists yet."""


def with_rate_intervals(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Each pick's extracted share with its 95% Wilson interval (``predictive.rate_interval``
    over the k picked texts), as columns rate_lo, rate_hi and the string rate_ci."""
    lo, hi, text = [], [], []
    for _, row in table.iterrows():
        k, e = int(row["k"]), int(row["extracted"])
        rate, a, b = pr.rate_interval(np.arange(k) < e, seed=seed)
        lo.append(a), hi.append(b), text.append(f"{rate:.2f} [{a:.2f}, {b:.2f}]")
    return table.assign(rate_lo=lo, rate_hi=hi, rate_ci=text)


def paper_paragraph(table: pd.DataFrame, overall: tuple[float, float, float]) -> str:
    """Table 3: ours next to the paper's per budget, and whether the claim holds.  Rule: reproduced
    when GNQ's top-k share is above the overall extraction rate (what a random pick gets in
    expectation) with its interval, at every budget, and above counterfactual memorization's."""
    rows, holds = [], []
    for f in FRACTIONS:
        gnq = table[(table["target"] == STRATEGIES[0][0]) & (table["fraction"] == f)]
        cf = table[(table["target"] == STRATEGIES[2][0]) & (table["fraction"] == f)]
        pe, pk = PAPER_TABLE3[("GNQ", f)]
        ce, ck_ = PAPER_TABLE3[("Counterfactual", f)]
        ours = gnq["rate_ci"].iloc[0] if len(gnq) else "n/a"
        ours_cf = cf["rate_ci"].iloc[0] if len(cf) else "n/a"
        rows.append(f"top-{f:.0%}: paper GNQ {pe}/{pk} = {pe / pk:.2f}, counterfactual {ce}/{ck_} = "
                    f"{ce / ck_:.2f}; ours GNQ {ours}, counterfactual {ours_cf}")
        holds.append(len(gnq) > 0 and gnq["rate_lo"].iloc[0] > overall[0]
                     and (cf.empty or gnq["rate"].iloc[0] > cf["rate"].iloc[0]))
    verdict = ("reproduced" if all(holds) else "partly reproduced (at " + str(sum(holds)) + " of "
               f"{len(holds)} budgets)" if any(holds) else "not reproduced")
    return ("**Paper (§6.3, Table 3; GPT-2 fine-tuned on 400 sentences, p = 12, exact match):** GNQ's top "
            "picks are almost all extracted, far above counterfactual memorization and random picks "
            "(25–45%). **This run:** " + "; ".join(rows) + f". Overall (what a random pick gets in "
            f"expectation): {overall[0]:.2f} [{overall[1]:.2f}, {overall[2]:.2f}]. **Verdict:** {verdict}. "
            "Rule: GNQ's top-k share above the overall rate with its whole interval, and above "
            "counterfactual memorization's, at every budget.")


def predictive_auc(attacked: pd.DataFrame, seed: int | None = None) -> pd.DataFrame:
    """Per score: AUC of extracted vs. not, over all attacked texts and within each group; with a
    ``seed``, each cell is "AUC [95% bootstrap interval]" text instead of the number."""
    rows = []
    for label, column, descending in STRATEGIES:
        if column not in attacked.columns:
            continue
        sign = 1.0 if descending else -1.0
        row = {"score": label}
        for name, part in [("all", attacked)] + list(attacked.groupby("group")):
            values = sign * pd.to_numeric(part[column], errors="coerce")
            outcome = np.where(part["success"], "extracted", "kept")
            auc = group_auc(values, outcome, "extracted", "kept")
            row[f"AUC {name}"] = (auc if seed is None else
                                  rep.auc_cell(auc, values, part["success"], seed, cl.groups_of(part)))
        rows.append(row)
    return pd.DataFrame(rows)


def _reading(by_group: pd.DataFrame, aucs: pd.DataFrame, paraphrased: bool = False) -> str:
    """What the group rates and the within-group AUCs say, in words chosen by the numbers."""
    rates = dict(zip(by_group["group"], by_group["rate"], strict=True))
    lines = ["- By group: " + ", ".join(f"{g} {rep.fmt(v)}" for g, v in rates.items()) + " extracted."]
    common, surprising = rates.get(ck.NEGATIVE, np.nan), rates.get(ck.POSITIVE, np.nan)
    if common > surprising:
        how = "in other words" if paraphrased else "verbatim"
        lines.append(f"  The facts were in the pretraining data ({how}); whether that is why the attack "
                     "recovers them more often than the claims is not tested here (the common-knowledge "
                     "report shows the tiny model does not know the facts in the audit's wording), and "
                     "the group rates' intervals are in the table below.")
    gnq = aucs.set_index("score").loc[STRATEGIES[0][0]]
    within = ", ".join(f"{c.removeprefix('AUC ')} {rep.fmt(v)}" for c, v in gnq.items() if c != "AUC all")
    lines.append(f"- GNQ (max) as a predictor of extraction: AUC {rep.fmt(gnq['AUC all'])} over all texts; "
                 f"within groups {within}.")
    return "\n".join(lines)


def _verdict(table: pd.DataFrame, overall: float) -> str:
    rates = table.groupby(["target", "fraction"])["rate"].mean()
    lines = [f"- Overall {rep.fmt(overall)} of the attacked texts are extracted."]
    better = clear = 0
    for f in FRACTIONS:
        random = table[(table["fraction"] == f) & table["target"].str.startswith("Random")]["rate"].mean()
        picks = {t: rates.get((t, f), np.nan) for t, _, _ in STRATEGIES}
        top = max((v for v in picks.values() if not np.isnan(v)), default=np.nan)
        best = [t for t, v in picks.items() if v == top]
        lines.append(f"- Top {f:.0%}: GNQ {rep.fmt(picks[STRATEGIES[0][0]])}, counterfactual "
                     f"{rep.fmt(picks[STRATEGIES[2][0]])}, loss {rep.fmt(picks[STRATEGIES[3][0]])}, random "
                     f"{rep.fmt(random)} (highest: {', '.join(best) if len(best) == 1 else 'a tie'}).")
        better += picks[STRATEGIES[0][0]] > random
        gnq = table[(table["target"] == STRATEGIES[0][0]) & (table["fraction"] == f)]
        clear += bool(len(gnq) and "rate_lo" in gnq and gnq["rate_lo"].iloc[0] > overall)
    lines.append(f"- GNQ's picks are extracted more often than random picks as point estimates at {better} "
                 f"of {len(FRACTIONS)} budgets; GNQ's interval lies above the overall rate (what a random "
                 f"pick gets in expectation) at {clear} of {len(FRACTIONS)} (paper Table 3: at every "
                 "budget, far more).")
    return "\n".join(lines)
