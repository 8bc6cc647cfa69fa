"""Common knowledge vs. made-up claims at real-model scale (paper §6.2 on a pretrained model):
``python -m research study common-knowledge --scale real``.

The tiny scale pretrains its own GPT-2, which never learns the facts in other words, so the
paper's premise fails there.  Here the base model is a real pretrained one (SmolLM2-135M-Instruct,
``gnq model fetch smollm2``; or ``--model DIR``):

1. Premise: under the base model, is each fact's object more expected than its made-up claim's
   object after the same prefix (same subject, same wording)?  Paired object-NLL gap with a
   bootstrap interval, and the share of pairs preferring the fact with a Wilson interval.
2. Fine-tune it on held-out true facts plus as many made-up claims (``data/knowledge.csv``, the
   same template per pair) with in-run GNQ (groups 'common' and 'surprising').
3. Per signal (in-run GNQ_total, gradient norm² K_jj, loss, Min-K%, Min-K%++ ...): AUC of
   made-up over true with bootstrap intervals, within exact token length, and the cross-validated
   gain over length + loss (``analysis.evidence``); Min-K%/Min-K%++ are the in-run values at
   the last epoch, the loss ratio divides the last epoch's loss by the base model's; counterfactual
   memorization from two complementary pairs of extra fine-tunes (each on half the set, no GNQ) —
   what the CPU budget affords, so a noisy estimate (each text in 2 models, out of 2).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import evidence as ev
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.signals import signal_frame
from gnq_core.attacks.run import run_extraction
from gnq_core.common.runtime import resolve_device
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.pipelines.train import run_training
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.real_models import PROVENANCE, cached_model
from gnq_core.sources.tokens import encode_texts, pad_id
from research.studies import counterfactual as cf
from research.studies import paraphrases
from research.studies import report as rep
from research.studies.base import StudyContext, Timings, same_settings_or_tag, write_dataset
from research.studies.signals import forward_signals

STUDY = "common-knowledge"
POSITIVE, NEGATIVE = "surprising", "common"


@dataclass(frozen=True)
class RealConfig:
    pairs: int  # facts (and as many made-up claims) fine-tuned
    cf_models: int  # counterfactual models (even: complementary halves)
    prefix_tokens: int  # the attack's prefix; extracted = the rest of the text exactly, the base model not
    finetune: TrainSettings


# Sized for ≤ 20 min wall on one thread of a shared 2-core CPU: 100 short texts, 4 epochs, B 8, and
# two complementary pairs of counterfactual models (each text in 2, out of 2).
REAL = RealConfig(pairs=50, cf_models=4, prefix_tokens=6,
                  finetune=TrainSettings(epochs=4, batch_size=8, lr=1e-4, lam=1e-2, max_length=24))


def base_model(model: Path | None = None) -> Path:
    path = Path(model) if model is not None else cached_model()
    if path is None or not (path / "config.json").is_file():
        raise ValueError(f"{path or 'the real-model cache'}: no pretrained model found; run "
                         "`gnq model fetch smollm2` (or pass --model DIR)")
    return path


def with_token_signals(frame: pd.DataFrame, store, run, base_loss: np.ndarray) -> pd.DataFrame:
    """The evidence frame plus Min-K% and Min-K%++ at the run's last point (the in-run values of the
    last epoch, the point ``loss_last`` comes from) and the loss ratio to the base model."""
    scores = store.scores(run.run_id)
    last = scores[scores["point"] == scores["point"].max()].set_index("example_id")
    out = frame.drop(columns=["min_k_prob", "min_k_plus", "loss_ratio"], errors="ignore")
    out = out.set_index("example_id")
    out["min_k_prob"], out["min_k_plus"] = last["min_k"], last["min_k_plus"]
    out["loss_ratio"] = out["loss_last"] / pd.Series(base_loss, index=np.arange(len(base_loss)))
    return out.reset_index()


def run(ctx: StudyContext, model: Path | None = None) -> Path:
    cfg = REAL
    ft = TrainSettings(**(asdict(cfg.finetune) | {"seed": ctx.seed, "device": ctx.device}))
    init = base_model(model)
    provenance = (json.loads((init / PROVENANCE).read_text(encoding="utf-8")) if (init / PROVENANCE).is_file()
                  else {})
    store, label, work = ctx.store, ctx.label(STUDY), ctx.work_dir(STUDY)
    timings = Timings(work)
    words = paraphrases.bank(cfg.pairs, ctx.seed)
    n = min(cfg.pairs, len(words.facts))
    data = load_texts(write_dataset(work / "finetune.csv", words.facts[:n] + words.claims[:n],
                                    [NEGATIVE] * n + [POSITIVE] * n))
    with timings.stage("premise (base model)"):
        device = resolve_device(ctx.device)
        model, tokenizer = load_checkpoint(init, device=device)
        premise = paraphrases.premise_rows(
            model, tokenizer, words, n, ft.max_length, ctx.seed, device,
            ("another wording (the first template)", "the fine-tune's wording"))
        # each text's mean next-token NLL under the base model: the loss ratio's reference
        ids = encode_texts(tokenizer, data.texts, ft.max_length)
        base_loss = forward_signals(model, ids, pad_id(tokenizer), device=device)["loss"].to_numpy(float)
    name = f"{label}.finetune"
    with timings.stage("fine-tune"), ctx.reporter(name) as r, same_settings_or_tag():
        finetune = run_training(store, data, work / "finetune", name=name, init=init, settings=ft, reporter=r)
    with timings.stage("counterfactual models"), ctx.reporter(name) as r:
        cf.counterfactual(ctx, finetune, init, data, ft, cfg.cf_models, work / "counterfactual", r)
    with timings.stage("extraction attack"), ctx.reporter(name) as r:
        if store.extractions(finetune.run_id).empty:  # a rerun keeps the stored attack
            run_extraction(store, finetune, prefix_tokens=cfg.prefix_tokens, suffix_tokens=None,
                           threshold=1.0, reference=str(init), device=ctx.device, reporter=r)
    with timings.stage("report"):
        frame = with_token_signals(signal_frame(store, finetune), store, finetune, base_loss)
        y = (frame["group"] == POSITIVE).astype("boolean")
        outcomes = [ev.Outcome("group", f"group = {POSITIVE}", y)]
        outcomes += [o for o in ev.outcomes_in(frame) if o.name == "extraction"]
        table = ev.evidence_table(frame, seed=ctx.seed, outcomes=outcomes)
        ratio = store.scores(finetune.run_id).eval("gnq * @ft.lam / self_influence")
    return write_report(ctx, cfg, ft, init, provenance, premise, table, frame, ratio, finetune.name, timings)


def _claim(table: pd.DataFrame, signal: str, scope: str) -> pd.Series | None:
    part = table[(table["signal"] == signal) & (table["scope"] == scope)
                 & (table["unit"] == "texts" if "unit" in table.columns else True)]
    return part.iloc[0] if len(part) else None


def _ci(row: pd.Series | None, key: str = "auc", fmt: str = ".2f") -> str:
    if row is None or pd.isna(row.get(key)):
        return "n/a"
    return f"{row[key]:{fmt}} [{row[f'{key} lo']:{fmt}}, {row[f'{key} hi']:{fmt}}]"


def verdicts(table: pd.DataFrame, premise: pd.DataFrame, cf_models: int) -> list[str]:
    """The paper's §6.2 claims, each reproduced or not by a rule stated beside it."""
    new = premise.iloc[-1]
    g_all, g_len = _claim(table, "gnq_total", ev.SCOPE_ALL), _claim(table, "gnq_total", ev.SCOPE_LENGTH)
    g_gain = _claim(table, "gnq_total", ev.SCOPE_GAIN)
    loss_all = _claim(table, ev.LOSS, ev.SCOPE_ALL)
    cf_all = _claim(table, cf.CF_METRIC, ev.SCOPE_ALL)
    above = g_all is not None and g_all["auc lo"] > 0.5
    more = (above and cf_all is not None and abs(g_all["auc"] - 0.5) > abs(cf_all["auc"] - 0.5))
    lines = [
        f"- **Premise: the base model knows the facts in the fine-tune's wording** — "
        f"{'holds' if new['gap lo'] > 0 else 'does not hold'}: object NLL gap (claim minus fact) "
        f"{new['gap']:.2f} [{new['gap lo']:.2f}, {new['gap hi']:.2f}] nats; the fact's object is the more "
        f"expected in {new['share']:.2f} [{new['share lo']:.2f}, {new['share hi']:.2f}] of the pairs "
        "(rule: the gap's interval above 0).",
        f"- **Made-up claims have larger GNQ than common facts (Fig. 3)** — "
        f"{'reproduced' if above else 'not reproduced'}: in-run GNQ_total AUC {_ci(g_all)}, within exact "
        f"length {_ci(g_len)} (rule: the all-texts interval above 0.5).",
        "- **GNQ tells more than loss** — "
        + ("reproduced" if g_gain is not None and g_gain["gain lo"] > 0 else "not reproduced")
        + f": CV AUC gain of GNQ_total over length + loss {_ci(g_gain, 'gain', '+.3f')}; loss alone "
        f"{_ci(loss_all)} in the direction 'lower loss = made-up' (below 0.5: the made-up claims keep the "
        "higher loss) (rule: the gain's interval above 0).",
        "- **Counterfactual memorization separates the groups less than GNQ (Fig. 3–4)** — "
        + ("not tested (no counterfactual models)" if cf_all is None else
           ("reproduced" if more else "not reproduced")
           + f": counterfactual memorization AUC {_ci(cf_all)} ({cf_models} models on complementary halves), "
           f"GNQ_total "
           f"{_ci(g_all)} (rule: GNQ's interval above 0.5 and its AUC further from 0.5 than "
           "counterfactual memorization's)") + ".",
    ]
    return lines


def write_report(ctx: StudyContext, cfg: RealConfig, ft: TrainSettings, init: Path, provenance: dict,
                 premise: pd.DataFrame, table: pd.DataFrame, frame: pd.DataFrame, ratio: pd.Series,
                 run_name: str, timings: Timings) -> Path:
    r = rep.Report(ctx.report_dir(STUDY), "Common knowledge vs. made-up claims on a real model (paper §6.2)")
    model = provenance.get("model", init.name)
    r.text(f"""> **Scale: real model, CPU ({cfg.pairs} facts + {cfg.pairs} made-up claims, {ft.epochs} epochs,
> B = {ft.batch_size}, {cfg.cf_models} counterfactual models)**, not the paper's (GPT-2 fine-tuned on
> 200 + 200 sentences, 10 models for counterfactual memorization). The tiny scale
> (`--scale full`/`--quick`) pretrains its own GPT-2.

Model: {model} (`{init}`){f", from `{provenance['package']}` (wheel sha256 `{provenance['wheel_sha256']}`)"
        if provenance.get('package') else ''}; model.safetensors sha256
`{provenance.get('model_sha256', 'unknown')}`. Fine-tuned with in-run GNQ (λ = {ft.lam:g},
B = {ft.batch_size}, AdamW lr {ft.lr:g}, {ft.epochs} epochs, max length {ft.max_length} tokens,
seed {ft.seed}, per-example mean next-token NLL) on {cfg.pairs} true facts of
`data/knowledge.csv` (capitals, chemical symbols, authors, discoveries; each in its relation's last
template) plus {cfg.pairs} made-up claims in the same template, each pairing a subject with another
subject's object (groups `common` and `surprising`; run `{run_name}` in the store). Load average
when this report was written {', '.join(f'{v:.1f}' for v in os.getloadavg())} (the 2 cores are
shared by other jobs).""")
    r.text("## The paper's claims and this run")
    r.text("\n".join(verdicts(table, premise, cfg.cf_models)))
    r.text("## Premise: does the base model prefer the true object?")
    shown = premise.assign(**{"gap (claim − fact) [95% CI]": rep.ci_column(premise, "gap"),
                              "pairs preferring the fact [Wilson 95%]": rep.ci_column(premise, "share")})
    r.table(shown[["wording", "pairs", "object NLL facts", "object NLL claims", "gap (claim − fact) [95% CI]",
                   "pairs preferring the fact [Wilson 95%]"]],
            {"object NLL facts": ".2f", "object NLL claims": ".2f"},
            caption="Object NLL: summed next-token NLL (nats) of the object and what follows it, after "
                    "the sentence's own prefix, under the base model before any fine-tuning; each fact "
                    "paired with its claim (same subject, same wording). Gap interval: "
                    f"{pr.RESAMPLES} bootstrap resamples over pairs.")
    r.text("## Separation of made-up claims from facts after the fine-tune")
    r.table(ev.display(table, "group", f"group = {POSITIVE}"),
            caption=ev.method(pr.RESAMPLES, ctx.seed, pr.LEVEL)
            + " Positive: a made-up claim (`surprising`).")
    r.text(ev.gain_sentence(table, "group"))
    r.text(f"""## What GNQ is on this run

{rep.ratio_sentence(ratio)} Token lengths: {int(frame['n_tokens'].min())}–{int(frame['n_tokens'].max())}
(a fact and its claim share the template; their objects' token counts differ).""")
    extraction_section(r, frame, table, cfg, ctx.seed)
    results = {"model": model, "model_sha256": provenance.get("model_sha256"), "run": run_name,
               "config": asdict(cfg), "premise": premise.to_dict("records"),
               "evidence": table.to_dict("records"), "gnq_lambda_over_kjj_median": float(ratio.median())}
    return r.write(results, command=ctx.command, timings=timings, device=ctx.device)


def extraction_section(r: rep.Report, frame: pd.DataFrame, table: pd.DataFrame, cfg: RealConfig,
                       seed: int) -> None:
    """Paper §6.3 (Table 3) on this fine-tune: the share extracted among the top 5/10/20% by each
    signal against the overall rate (what a random pick gets in expectation), and the evidence
    table for the attack's outcome."""
    attacked = frame[frame["extracted"].notna()]
    r.text(f"## Extraction (paper §6.3, Table 3) on this fine-tune\n\nPrefix attack on the last "
           f"checkpoint: the first {cfg.prefix_tokens} tokens given, greedy decoding must reproduce the rest "
           "of the text exactly, and the base model must not (calibrated, the base model as reference).")
    if attacked.empty or not 0 < attacked["extracted"].astype(bool).sum() < len(attacked):
        r.text(f"{len(attacked)} texts attacked; every one had the same outcome, so no signal can be "
               "scored against it.")
        return
    y = attacked["extracted"].astype(bool)
    rate, lo, hi = pr.rate_interval(y)
    by_group = ", ".join(f"{g} {int(part.sum())}/{len(part)}" for g, part in y.groupby(attacked["group"]))
    result = pr.evaluate(attacked, seed=seed)
    gnq = result.table.set_index("signal").loc["gnq_total"] if "gnq_total" in set(result.table["signal"]) \
        else None
    above = [q for q in pr.TOP_FRACTIONS if gnq is not None and gnq[f"precision@{q:g} lo"] > rate]
    r.text(f"""{len(attacked)} texts attacked, {int(y.sum())} extracted: rate {rate:.2f} [{lo:.2f}, {hi:.2f}]
(Wilson); by group {by_group}. **Paper (Table 3): GNQ's top picks are almost all extracted, far above
random picks.** This run: GNQ_total's top 5/10/20% are extracted at """
           + ", ".join(f"{gnq[f'precision@{q:g}']:.2f} [{gnq[f'precision@{q:g} lo']:.2f}, "
                       f"{gnq[f'precision@{q:g} hi']:.2f}]" for q in pr.TOP_FRACTIONS)
           + f"; its interval lies above the overall rate at {len(above)} of {len(pr.TOP_FRACTIONS)} budgets "
           f"— **{'reproduced' if len(above) == len(pr.TOP_FRACTIONS) else 'not reproduced'}** (rule: "
           "above the overall rate with the whole interval at every budget).")
    r.table(pr.display_table(result), caption=result.method())
    r.table(ev.display(table, "extraction"), caption="The same outcome with the length controls: AUC within "
            "exact token length and CV gain over length + loss (method as in the table above).")
    length_only = _claim(table[table["outcome"] == "extraction"], ev.LOSS, ev.SCOPE_GAIN)
    g_len = _claim(table[table["outcome"] == "extraction"], "gnq_total", ev.SCOPE_LENGTH)
    r.text(ev.gain_sentence(table, "extraction")
           + (f" Text length alone (the spline, cross-validated) reaches AUC {length_only['auc base']:.2f}; "
              f"GNQ_total within exact length: {_ci(g_len)}." if length_only is not None else ""))
