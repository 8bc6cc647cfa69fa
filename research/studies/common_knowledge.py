"""Study: GNQ of common knowledge vs. surprising false claims (paper §6.2, Fig. 3–4).

1. Pretrain a GPT-2 from scratch on real text (WikiText-2 pieces and AG News rows from
   ../shared/data) into which the facts are mixed in other words: each fact of
   ``data/knowledge.csv`` in four paraphrases (``paraphrases.py``), each ``fact_copies`` times,
   so the model "knows" them the way the paper's GPT-2 knew its facts from web text (a plain
   loop without GNQ; checkpoints under the study's work folder).  The fine-tune and the audit
   state each fact in a fifth wording pretraining never used; the made-up claims pair each
   subject with another subject's object, in that same wording.  With ``--facts/--claims``
   files instead, those sentences are used and the facts are mixed in verbatim (the older design).
2. Audit the pretrained model post hoc on the fine-tuning set (NAME.before): the loss gap
   shows whether the facts were learned.
3. Fine-tune it on the facts plus as many surprising false claims with in-run GNQ (NAME.finetune,
   groups 'common' and 'surprising').
4. Counterfactual memorization (Zhang et al.): fine-tune ``cf_models`` more models the same way,
   each on half of the set; models come in complementary pairs, so every text is in exactly
   half of them; mem(x) = mean token accuracy on x of the models trained with x minus that of
   the models trained without it.  Stored per example as metric 'counterfactual_memorization'.
5. Report GNQ, loss and self-influence K_jj per group over the epochs, the AUC separating the
   groups for each, and the same for counterfactual memorization.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.signals import signal_frame
from gnq_core.analysis.summaries import group_auc, group_separation
from gnq_core.common.runtime import resolve_device
from gnq_core.pipelines.audit import run_audit
from gnq_core.pipelines.resume import TRAINER_STATE
from gnq_core.pipelines.settings import AuditSettings, TrainSettings
from gnq_core.pipelines.train import run_training, start_training
from gnq_core.pipelines.training_loop import Callback, Checkpoints, Epoch, Progress, seeded_batches, train
from gnq_core.results.store_queries import Run
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import TextDataset, load_texts
from gnq_core.sources.tokens import encode_texts, pad_id
from research.studies import paraphrases
from research.studies import report as rep
from research.studies.base import (
    StudyContext,
    Timings,
    ag_news,
    read_sentences,
    same_settings_or_tag,
    wikitext_chunks,
    write_dataset,
)
from research.studies.counterfactual import CF_METRIC, counterfactual

STUDY = "common-knowledge"
POSITIVE, NEGATIVE = "surprising", "common"  # AUC > 0.5: surprising claims score higher


@dataclass(frozen=True)
class Config:
    wiki_chunks: int        # WikiText-2 pieces in the pretraining corpus
    news_rows: int          # AG News rows in the pretraining corpus
    chunk_words: int        # words per WikiText-2 piece (at most)
    fact_copies: int        # times each pretraining paraphrase (or, with --facts, each fact) appears
    pairs: int | None       # facts (and as many claims) fine-tuned; None: as many as both files have
    cf_models: int          # counterfactual models (even: complementary halves)
    pretrain: TrainSettings
    finetune: TrainSettings


FULL = Config(wiki_chunks=1200, news_rows=600, chunk_words=24, fact_copies=2, pairs=None, cf_models=16,
              pretrain=TrainSettings(epochs=8, batch_size=16, lr=2e-3, lam=1e-2, max_length=40,
                                     preset="tiny", vocab_size=2048),
              finetune=TrainSettings(epochs=12, batch_size=16, lr=3e-3, lam=1e-2, max_length=40))
# GPT-2 small (12×768) from scratch, for a CUDA GPU: the paper fine-tunes a fully trained GPT-2 on
# 400 sentences; here it is pretrained on ~18k real texts holding the facts in other words first.
# lr 1.5e-4 at B 16: what trained GPT-2 small from scratch on an H100 (3e-4 and 6e-4 diverged).
PAPER = Config(wiki_chunks=12000, news_rows=6000, chunk_words=24, fact_copies=4, pairs=None, cf_models=16,
               pretrain=TrainSettings(epochs=15, batch_size=16, lr=1.5e-4, lam=1e-2, max_length=64,
                                      preset="gpt2-small", vocab_size=8192),
               finetune=TrainSettings(epochs=10, batch_size=16, lr=5e-5, lam=1e-2, max_length=64))
QUICK = Config(wiki_chunks=80, news_rows=40, chunk_words=20, fact_copies=3, pairs=12, cf_models=4,
               pretrain=TrainSettings(epochs=1, batch_size=16, lr=3e-3, lam=1e-2, max_length=32,
                                      preset="tiny", vocab_size=400),
               finetune=TrainSettings(epochs=2, batch_size=8, lr=1e-3, lam=1e-2, max_length=32))


@dataclass
class Prepared:
    """The study's runs and what went into them (for the report and the extraction study)."""

    config: Config
    pretrained: Path  # the pretrained checkpoint folder
    before: Run
    finetune: Run
    pairs: int
    corpus: dict[str, int]
    timings: Timings
    facts_path: Path
    claims_path: Path
    words: paraphrases.Bank | None = None  # the paraphrased facts (None: --facts/--claims verbatim)


def config_for(ctx: StudyContext, cf_models: int | None = None) -> Config:
    cfg = ctx.pick(QUICK, FULL, PAPER)
    cfg = replace(cfg, pretrain=replace(cfg.pretrain, seed=ctx.seed, device=ctx.device),
                  finetune=replace(cfg.finetune, seed=ctx.seed, device=ctx.device))
    if cf_models is not None:
        cfg = replace(cfg, cf_models=cf_models)
    if cfg.cf_models < 2 or cfg.cf_models % 2:
        raise ValueError(f"--cf-models must be even and at least 2 (complementary halves), "
                         f"got {cfg.cf_models}")
    return cfg


def prepare(ctx: StudyContext, facts: Path | None = None, claims: Path | None = None,
            cf_models: int | None = None) -> Prepared:
    """Pretrain, audit, fine-tune and train the counterfactual models; each step resumes."""
    cfg = config_for(ctx, cf_models)
    data_dir = ctx.shared_data()
    if (facts is None) != (claims is None):
        raise ValueError(f"{facts or claims}: pass both --facts and --claims (verbatim sentences), or "
                         "neither "
                         f"(the paraphrased facts of {paraphrases.KNOWLEDGE.name})")
    if facts is None:
        facts_path = claims_path = paraphrases.KNOWLEDGE
        words = paraphrases.bank(cfg.pairs, ctx.seed)
        fact_texts, claim_texts, taught = words.facts, words.claims, words.pretrain
    else:
        words = None
        facts_path, claims_path = Path(facts), Path(claims)
        fact_texts, claim_texts = read_sentences(facts_path), read_sentences(claims_path)
        taught = None
    n = min(len(fact_texts), len(claim_texts), cfg.pairs or len(fact_texts))
    if n < 4:
        raise ValueError(f"{facts_path} and {claims_path}: need at least 4 sentences in each "
                         f"(have {len(fact_texts)} and {len(claim_texts)})")
    fact_texts, claim_texts = fact_texts[:n], claim_texts[:n]
    taught = fact_texts if taught is None else taught  # verbatim facts: the older design
    store, label, work = ctx.store, ctx.label(STUDY), ctx.work_dir(STUDY)
    timings = Timings(work)

    wiki = wikitext_chunks(data_dir, cfg.wiki_chunks, cfg.chunk_words)
    news = [text for text, _ in ag_news(data_dir, cfg.news_rows)]
    texts = wiki + news + taught * cfg.fact_copies
    groups = ["wikitext"] * len(wiki) + ["ag_news"] * len(news) + ["fact"] * (len(taught) * cfg.fact_copies)
    order = np.random.default_rng(ctx.seed).permutation(len(texts))
    pre_data = load_texts(write_dataset(work / "pretrain.csv", [texts[i] for i in order],
                                        [groups[i] for i in order]))
    ft_data = load_texts(write_dataset(work / "finetune.csv", fact_texts + claim_texts,
                                       [NEGATIVE] * n + [POSITIVE] * n))

    before_name, ft_name = f"{label}.before", f"{label}.finetune"
    with timings.stage("pretrain"), ctx.reporter(before_name) as r:
        init = pretrain(pre_data, work / "pretrain", cfg.pretrain, r)
    ft = cfg.finetune
    with timings.stage("audit of the pretrained model"), ctx.reporter(before_name) as r, \
            same_settings_or_tag():
        before = run_audit(store, init, ft_data, name=before_name, reporter=r,
                           settings=AuditSettings(lam=ft.lam, batch_size=ft.batch_size,
                                                  max_length=ft.max_length, seed=ft.seed, device=ft.device))
    with timings.stage("fine-tune"), ctx.reporter(ft_name) as r, same_settings_or_tag():
        finetune = run_training(store, ft_data, work / "finetune", name=ft_name, init=init, settings=ft,
                                reporter=r)
    with timings.stage("counterfactual models"), ctx.reporter(ft_name) as r:
        counterfactual(ctx, finetune, init, ft_data, ft, cfg.cf_models, work / "counterfactual", r)
    return Prepared(cfg, init, before, finetune, n, {"wikitext": len(wiki), "ag_news": len(news)}, timings,
                    facts_path, claims_path, words)


# ----------------------------------------------------------------------------------------- pretraining
def pretrain(dataset: TextDataset, out_dir: Path, settings: TrainSettings, reporter,
             keep: Collection[int] | None = None) -> Path:
    """Train a tokenizer and a GPT-2 from scratch on the corpus, without GNQ (the study's GNQ is in
    the fine-tune; leaving it out here saves most of the compute).  A checkpoint is saved per
    epoch, with the trainer state (pipelines/resume.py) beside the latest only; a rerun continues
    after the last saved epoch.  ``keep``: the epochs whose checkpoints stay (None: all; the last
    always stays), so a GPT-2-small sweep of 100 epochs keeps its schedule's checkpoints, not 100
    of ~1 GB each.
    Returns the final checkpoint folder."""
    final = out_dir / f"epoch-{settings.epochs}"
    if (final / TRAINER_STATE).is_file():
        return final
    device = resolve_device(settings.device)
    start = next((e for e in range(settings.epochs - 1, 0, -1)
                  if (out_dir / f"epoch-{e}" / TRAINER_STATE).is_file()), 0)  # the latest saved epoch
    model, tokenizer, optimizer, _ = start_training(dataset, None, settings, device,
                                                    out_dir / f"epoch-{start}" if start else None)
    ids = encode_texts(tokenizer, dataset.texts, settings.max_length)
    # the one training loop, without the GNQ callback
    train(model, optimizer, ids, pad_id(tokenizer), device,
          seeded_batches(range(len(ids)), settings.batch_size, settings.seed),
          epochs=range(start, settings.epochs), loss=settings.loss,
          callbacks=[Progress(reporter, settings.epochs, "pretrain epoch"),
                     Checkpoints(model, tokenizer, optimizer, out_dir), _LatestStateOnly(out_dir, keep)])
    return final


class _LatestStateOnly(Callback):
    """After ``Checkpoints``: the previous epoch's trainer state goes (only the latest is needed to
    resume), and its folder too unless ``keep`` lists it."""

    def __init__(self, out_dir: Path, keep: Collection[int] | None) -> None:
        self.out_dir, self.keep = out_dir, keep

    def epoch_end(self, epoch: Epoch) -> None:
        previous = self.out_dir / f"epoch-{epoch.number}"
        if epoch.number >= 1 and previous.is_dir():
            (previous / TRAINER_STATE).unlink(missing_ok=True)
            if self.keep is not None and epoch.number not in self.keep:
                shutil.rmtree(previous)


# ----------------------------------------------------------------------------------------- report
METRICS = [("gnq", "GNQ"), ("loss", "loss"), ("self_influence", "self-influence K_jj")]


def separation_tables(ctx: StudyContext, prep: Prepared) -> dict[str, pd.DataFrame]:
    """The numbers of the report, all read back from the store."""
    store = ctx.store
    traj = store.trajectories(prep.finetune.run_id)
    before = store.trajectories(prep.before.run_id).assign(point=-1, label="pretrained")
    both = pd.concat([before, traj], ignore_index=True)
    per_point = None
    for value, name in METRICS:
        sep = group_separation(both, POSITIVE, NEGATIVE, value=value)
        sep = sep.rename(columns={"auc": f"AUC {name}", "median_positive": f"median {name} surprising",
                                  "median_negative": f"median {name} common"})
        keep = ["label", f"median {name} common", f"median {name} surprising", f"AUC {name}"]
        per_point = sep[keep] if per_point is None else per_point.merge(sep[keep], on="label")
    examples = store.examples(prep.finetune.run_id).rename(columns={"grp": "group"})
    cf = examples.merge(store.metrics(prep.finetune.run_id), on="example_id", how="left")
    last = traj[traj["point"] == traj["point"].max()]
    mean = traj.groupby(["example_id", "group"], as_index=False)[["gnq", "loss", "self_influence"]].mean()

    def row(name: str, values: pd.Series, groups: pd.Series, lengths: pd.Series, mean_auc: float,
            ids: pd.Series) -> dict:
        return {"score": name, "AUC at the last epoch": group_auc(values, groups, POSITIVE, NEGATIVE),
                "AUC of the mean over epochs": mean_auc, "median common": values[groups == NEGATIVE].median(),
                "median surprising": values[groups == POSITIVE].median(),
                **auc_intervals(values, groups, lengths, ctx.seed, copy_clusters(examples, ids))}

    lengths = last["example_id"].map(examples.set_index("example_id")["n_tokens"])
    summary = [row(name, last[value], last["group"], lengths,
                   group_auc(mean[value], mean["group"], POSITIVE, NEGATIVE), last["example_id"])
               for value, name in METRICS]
    cf_values = cf.get(CF_METRIC, pd.Series(np.nan, index=cf.index))
    cf_auc = group_auc(cf_values, cf["group"], POSITIVE, NEGATIVE)
    summary.append(row("counterfactual memorization", cf_values, cf["group"], cf["n_tokens"], cf_auc,
                       cf["example_id"]))
    lam = prep.finetune.lam
    relation = {"spearman": float(last["gnq"].rank().corr(last["self_influence"].rank())),
                "ratio": float((last["gnq"] * lam / last["self_influence"]).median()), "lam": lam}
    return {"traj": traj, "both": both, "per_point": per_point, "summary": pd.DataFrame(summary),
            "relation": relation, "examples": examples,
            "cf": cf.assign(cf=cf_values)}


def copy_clusters(examples: pd.DataFrame, ids: pd.Series) -> np.ndarray:
    """The copy cluster of each of ``ids`` (the fine-tune's example ids; the pretrained audit uses
    the same texts in the same order): a text without one is a record of its own."""
    known = cl.CLUSTER in examples.columns
    cluster = ids.map(examples.set_index("example_id")[cl.CLUSTER]) if known else np.nan
    return cl.groups_of(pd.DataFrame({cl.CLUSTER: cluster}, index=ids.index))


def auc_intervals(values: pd.Series, groups: pd.Series, n_tokens: pd.Series, seed: int,
                  clusters: np.ndarray | None = None) -> dict[str, object]:
    """The AUC of surprising over common with its 95% interval (copy ``clusters`` resampled
    together, each group on its own; ``report.auc_interval``), and the same within exact token
    length, pair-weighted (``predictive.within_length_auc``): "0.85 [0.78, 0.91]"; "too few"
    under ``clusters.MIN_RECORDS`` independent records of either group."""
    v = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    y = (groups == POSITIVE).to_numpy()
    keep = np.isfinite(v) & groups.isin([POSITIVE, NEGATIVE]).to_numpy()
    if not (0 < y[keep].sum() < keep.sum()):
        return {"AUC [95% CI]": "n/a", "AUC within exact length": "n/a"}
    g = None if clusters is None else np.asarray(clusters)[keep]
    auc = float(pr.metrics_matrix(v[keep], y[keep], fpr_levels=(), fractions=())["auc"][0])
    cell = rep.auc_cell(auc, v[keep], y[keep], seed, g)
    lo, hi = rep.auc_interval(v[keep], y[keep], seed, g)
    w = pr.within_length_auc(v[keep], y[keep], pd.to_numeric(n_tokens, errors="coerce").to_numpy(float)[keep],
                             seed=seed, groups=g, min_records=cl.MIN_RECORDS)
    within = (f"{cl.TOO_FEW} ({w.strata} lengths)" if w.note else
              f"{w.auc:.3f} [{w.lo:.3f}, {w.hi:.3f}] ({w.strata} lengths)")
    return {"AUC [95% CI]": cell, "AUC within exact length": within,
            "auc": auc, "auc lo": lo, "auc hi": hi, "stratified auc": w.auc}


def with_auc_intervals(per_point: pd.DataFrame, both: pd.DataFrame, seed: int,
                       examples: pd.DataFrame | None = None) -> pd.DataFrame:
    """``per_point`` with each "AUC name" cell as "AUC [lo, hi]" (that point's texts, copies in
    ``examples``' clusters resampled together)."""
    out = per_point.copy()
    parts = [both[both["label"] == label] for label in out["label"]]
    for value, name in METRICS:
        out[f"AUC {name}"] = [
            rep.auc_cell(auc, part[value], part["group"] == POSITIVE, seed,
                         None if examples is None else copy_clusters(examples, part["example_id"]))
            for auc, part in zip(out[f"AUC {name}"], parts, strict=True)]
    return out


def run(ctx: StudyContext, facts: Path | None = None, claims: Path | None = None,
        cf_models: int | None = None) -> Path:
    if ctx.preset == "real":  # a pretrained model instead of our own pretraining
        from research.studies import common_knowledge_real

        if facts is not None or claims is not None or cf_models is not None:
            raise ValueError("--scale real uses data/knowledge.csv and no counterfactual models: "
                             "drop --facts/--claims/--cf-models")
        return common_knowledge_real.run(ctx)
    prep = prepare(ctx, facts, claims, cf_models)
    return write_report(ctx, prep)


def write_report(ctx: StudyContext, prep: Prepared) -> Path:
    t = separation_tables(ctx, prep)
    cfg, summary = prep.config, t["summary"].set_index("score")
    before_loss = t["both"][t["both"]["point"] == -1].groupby("group")["loss"].mean()
    auc = summary["AUC at the last epoch"]
    r = rep.Report(ctx.report_dir(STUDY), "Common knowledge vs. surprising claims (paper §6.2)")
    r.text(rep.scale_banner(ctx, f"GPT-2 ({cfg.pretrain.preset} preset)"))
    if prep.words is not None:
        taught = (f"each of {prep.pairs} facts (`{prep.facts_path.name}`: capitals, chemical symbols, "
                  "authors, "
                  f"discoveries) stated in {paraphrases.PRETRAIN_WORDINGS} paraphrases, each "
                  f"{cfg.fact_copies} times")
        words = (f"those {prep.pairs} facts in a fifth wording pretraining never used (group `common`) plus "
                 f"{prep.pairs} made-up claims in the same wording, each pairing a subject with another "
                 "subject's object and never seen in pretraining (group `surprising`); the two groups "
                 "share templates, so their lengths match by design")
    else:
        taught = f"each of {prep.pairs} fact sentences mixed in verbatim {cfg.fact_copies} times"
        words = (f"those {prep.pairs} facts (group `common`) plus {prep.pairs} surprising false claims "
                 f"(group `surprising`); sentences `{prep.facts_path.name}`, `{prep.claims_path.name}`")
    r.text(f"""A GPT-2 ({cfg.pretrain.preset} preset) is pretrained from scratch on
{prep.corpus['wikitext']} WikiText-2 pieces and {prep.corpus['ag_news']} AG News rows, with {taught}
({cfg.pretrain.epochs} epochs). It is then fine-tuned for {cfg.finetune.epochs} epochs on {words}, with
in-run GNQ (λ = {cfg.finetune.lam:g}, B = {cfg.finetune.batch_size}, per-example mean next-token NLL).
Pretraining is a plain training loop (no GNQ; checkpoint `{prep.pretrained.name}` under the study's
work folder). Runs in the store: `{prep.before.name}` (post-hoc audit of the pretrained model on the
fine-tuning set) and `{prep.finetune.name}` (the fine-tune with in-run GNQ; open it on the dashboard's
Groups and Extraction pages).

AUC is the probability that a random surprising claim scores higher than a random fact
(0.5: no separation, 1: every claim above every fact).
{pr.interval_method(pr.RESAMPLES, ctx.seed, pr.LEVEL)}""")

    r.text("## Result")
    gnq_auc, cf_auc, loss_auc = auc["GNQ"], auc["counterfactual memorization"], auc["loss"]
    r.text(_verdict(gnq_auc, cf_auc, loss_auc))
    shown = ["score", "AUC at the last epoch", "AUC [95% CI]", "AUC within exact length",
             "AUC of the mean over epochs", "median common", "median surprising"]
    r.table(t["summary"][shown], {"median common": ".4g", "median surprising": ".4g"},
            caption="Separation of the groups at the last fine-tuning epoch, and of each text's mean "
                    "over the epochs. Counterfactual memorization has one value per text. Within length "
                    "bins: the AUC inside each token-count bin, averaged over the bins.")
    r.text("## The paper's claim (Fig. 3–4) and this run")
    before = t["both"][t["both"]["point"] == -1]
    gap = loss_gap(before, ctx.seed, copy_clusters(t["examples"], before["example_id"]))
    knowledge = knowledge_table(prep, ctx.seed, ctx.device)
    r.text(paper_paragraph(summary, before_loss, gap, knowledge))
    r.text("""Earlier run of this study (quoted from the notes and the report at commit d876b60; CPU, tiny
GPT-2, the older design with the facts mixed into pretraining verbatim, no intervals): AUC of
surprising over common GNQ 0.849, counterfactual memorization 0.772, loss 0.970 — the loss
separated the groups best because the model had seen the facts word for word. No GPU run of this
study exists yet.""")
    rel = t["relation"]
    alike = "almost alike" if rel["spearman"] > 0.95 else "differently"
    r.text(f"""GNQ and self-influence rank the texts {alike} here: at the last epoch their Spearman
correlation is {rep.fmt(rel['spearman'])}, and the median of GNQ·λ/K_jj is {rep.fmt(rel['ratio'])}
(λ = {rel['lam']:g}). GNQ_j = g_jᵀ(Σ_{{k≠j}} g_k g_kᵀ + λI)⁻¹ g_j: with far more parameters than
batch companions (P ≫ B), most of g_j lies outside the span of the other {prep.config.finetune.batch_size - 1}
gradients and contributes ‖g_j,⊥‖²/λ, so a ratio near 1 means the companions remove little and
GNQ ≈ K_jj/λ on this model.""")

    r.text("## Did the pretrained model learn the facts?")
    r.text("Mean loss of the pretrained model (before fine-tuning): "
           + ", ".join(f"{g} {rep.fmt(v)}" for g, v in before_loss.items())
           + ". Lower loss on the facts than on the claims means pretraining taught the model the facts.")
    if knowledge is not None:
        r.table(knowledge.drop(columns=["_gap_lo"]),
                {"object NLL facts": ".2f", "object NLL claims": ".2f"},
                caption="Object NLL: the summed next-token NLL of the object (and what follows it) "
                "after the sentence's own prefix, under the pretrained model; each fact is paired with its "
                "claim (same subject, same wording, another object). Gap: claim minus fact, mean over the "
                "pairs [95% bootstrap interval over pairs]; a gap above 0 in the new wording means the model "
                "knows the fact in words it never saw.")

    r.text("## Per epoch")
    fmts = {c: ".4g" for c in t["per_point"].columns if c.startswith("median")}
    r.table(with_auc_intervals(t["per_point"], t["both"], ctx.seed, t["examples"]), fmts,
            caption="'pretrained': post-hoc audit of the pretrained model (fixed batches); epoch-K: in-run "
                    "GNQ during fine-tuning epoch K. AUC [95% bootstrap interval].")
    labels = list(dict.fromkeys(t["both"].sort_values("point")["label"]))
    groups = [NEGATIVE, POSITIVE]
    r.figure(rep.group_bands(t["both"], "gnq", groups, title="GNQ per group (median, 25–75%)",
                             ylabel="GNQ", xlabels=labels), "gnq_by_group.png",
             "GNQ of facts (orange) and surprising claims (blue), pretrained model then each epoch (Fig. 3).")
    r.figure(rep.group_histograms(t["cf"]["cf"], t["cf"]["group"], groups,
                                  title=f"Counterfactual memorization ({cfg.cf_models} models)",
                                  xlabel="counterfactual memorization"), "counterfactual_by_group.png",
             "Counterfactual memorization of facts and claims (Fig. 4).")
    r.figure(rep.group_bands(t["both"], "loss", groups, title="Loss per group", ylabel="loss", log=False,
                             xlabels=labels), "loss_by_group.png", "Per-example loss per group.")
    r.figure(rep.group_bands(t["both"], "self_influence", groups, title="Self-influence K_jj per group",
                             ylabel="K_jj", xlabels=labels), "self_influence_by_group.png",
             "Self-influence K_jj = ‖g_j‖² per group.")
    seps = {name: group_separation(t["both"], POSITIVE, NEGATIVE, value=v).sort_values("point")
            for v, name in METRICS}
    r.figure(rep.auc_lines(seps, {"counterfactual memorization": cf_auc},
                           title="AUC separating surprising claims from facts"), "auc.png",
             "AUC per epoch for GNQ, loss and K_jj; counterfactual memorization as a line.")

    r.text(f"""## Counterfactual memorization budget

{cfg.cf_models} extra fine-tunes from the same pretrained model with the same recipe
({cfg.finetune.epochs} epochs, lr {cfg.finetune.lr:g}, B = {cfg.finetune.batch_size}), each on half of the
{2 * prep.pairs} texts; models come in complementary pairs, so every text is in exactly
{cfg.cf_models // 2} of them. Score: next-token accuracy under teacher forcing. Stored per text as
metric `{CF_METRIC}` of run `{prep.finetune.name}`. Counterfactual memorization needs these
{cfg.cf_models} extra trainings; GNQ came from the one fine-tune's own backward passes.""")
    results = {"summary": t["summary"], "per_point": t["per_point"], "pairs": prep.pairs,
               "pretrained_loss_gap": list(gap), "knowledge": knowledge,
               "gnq_vs_self_influence": t["relation"],
               "config": asdict(cfg), "runs": [prep.before.name, prep.finetune.name]}
    r.text("## Does any of these scores predict extraction?")
    if ctx.store.extractions(prep.finetune.run_id).empty:
        r.text(f"No attack on `{prep.finetune.name}` is stored yet: `python -m research study extraction` "
               "attacks it, and a rerun of this study then adds the table here.")
    else:
        results |= rep.predictive_section(
            r, signal_frame(ctx.store, prep.finetune), filename="predictive_roc.png", seed=ctx.seed,
            what=f"The latest prefix attack stored for `{prep.finetune.name}` (the extraction study's).")
    return r.write(results, command=ctx.command, timings=prep.timings, device=ctx.device)


def loss_gap(before: pd.DataFrame, seed: int,
             clusters: np.ndarray | None = None) -> tuple[float, float, float]:
    """Mean loss of the claims minus that of the facts under the pretrained model, with a 95%
    interval over copy clusters (``clusters``; each group resampled on its own, a record's copies
    drawn together, expanded for few records); > 0 means the model knew the facts.  The interval
    is NaN under ``clusters.MIN_RECORDS`` independent records of either group."""
    part = before[before["group"].isin([POSITIVE, NEGATIVE])]
    keep = before["group"].isin([POSITIVE, NEGATIVE]).to_numpy()
    y = (part["group"] == POSITIVE).to_numpy()
    loss = part["loss"].to_numpy(float)
    if not 0 < y.sum() < len(y):
        return float("nan"), float("nan"), float("nan")
    gap = float(loss[y].mean() - loss[~y].mean())
    g = None if clusters is None else np.asarray(clusters)[keep]
    if cl.too_few(y, g):
        return gap, float("nan"), float("nan")
    w = cl.cluster_weights(y, g, pr.RESAMPLES, seed)
    boot = (w[:, y] @ loss[y]) / w[:, y].sum(1) - (w[:, ~y] @ loss[~y]) / w[:, ~y].sum(1)
    lo, hi = pr.interval(boot, pr.LEVEL, cl.effective_records(y, g))
    return gap, lo, hi


def knowledge_table(prep: Prepared, seed: int, device: str = "auto") -> pd.DataFrame | None:
    """Does the pretrained model expect each fact's object more than its claim's? In the wording
    it was taught (seen) and in the audit's wording (new); None for verbatim --facts files."""
    words = prep.words
    if words is None:
        return None
    dev = resolve_device(device)
    model, tokenizer = load_checkpoint(prep.pretrained, device=dev)
    rows = paraphrases.premise_rows(model, tokenizer, words, prep.pairs, prep.config.pretrain.max_length,
                                    seed, dev, ("seen in pretraining", "new (the audit's)"))
    return rows[["wording", "pairs", "object NLL facts", "object NLL claims"]].assign(**{
        "gap [95% CI]": rep.ci_column(rows, "gap"),
        "pairs with the fact's object more expected": rep.ci_column(rows, "share"),
        "_gap_lo": rows["gap lo"]})


def paper_paragraph(summary: pd.DataFrame, before_loss: pd.Series,
                    before_gap: tuple[float, float, float], knowledge: pd.DataFrame | None = None) -> str:
    """Fig. 3–4: reproduced or not, with numbers and intervals (rules stated, not tuned)."""
    g, c = summary.loc["GNQ"], summary.loc["counterfactual memorization"]
    gap, gap_lo, gap_hi = before_gap
    known = ("it knew the facts before the fine-tune" if gap_lo > 0
             else "not shown to know the facts: the interval reaches 0")
    if knowledge is not None:
        seen, new = knowledge.iloc[0], knowledge.iloc[1]
        known += (f"; object NLL gap, claim minus fact: {seen['gap [95% CI]']} in the wording seen in "
                  f"pretraining, {new['gap [95% CI]']} in the new wording — "
                  + ("the model knows the facts in other words, the paper's premise"
                     if new["_gap_lo"] > 0 else
                     "the model learned the facts only in the words it saw, so the paper's premise (facts "
                     "known in other words) does not hold for this model"))
    gnq_sep = g.get("auc lo", np.nan) > 0.5
    more = (abs(g["AUC at the last epoch"] - 0.5) > abs(c["AUC at the last epoch"] - 0.5)
            and not np.isnan(c["AUC at the last epoch"]))
    verdict = ("reproduced" if gnq_sep and more else
               "partly reproduced (GNQ separates the groups, but not more than counterfactual memorization)"
               if gnq_sep else "not reproduced")
    if knowledge is not None and not knowledge.iloc[1]["_gap_lo"] > 0:
        verdict = ("not testable at this scale — the model does not know the facts in other words, so "
                   f"'common knowledge' is not common to it; as measured: {verdict}")
    return (f"""**Paper (§6.2, Fig. 3–4; GPT-2 fine-tuned on 200 facts + 200 surprising claims, P100):** the
surprising claims have larger GNQ than the facts, and counterfactual memorization separates the groups
much less (the paper gives figures, no AUC). **This run:** GNQ AUC {g['AUC [95% CI]']} (within exact
length {g['AUC within exact length']}), counterfactual memorization {c['AUC [95% CI]']}, loss
{summary.loc['loss', 'AUC [95% CI]']}. The pretrained model's mean loss on the facts' new wording was
{rep.fmt(before_loss.get(NEGATIVE, np.nan))} vs {rep.fmt(before_loss.get(POSITIVE, np.nan))} on the claims, a
gap of {rep.fmt(gap)} [{rep.fmt(gap_lo)}, {rep.fmt(gap_hi)}] ({known}). **Verdict:**
{verdict}. Rule: reproduced when GNQ's interval lies above 0.5 and GNQ separates the groups more
than counterfactual memorization.""")


def _verdict(gnq_auc: float, cf_auc: float, loss_auc: float) -> str:
    def strength(a: float) -> str:
        d = abs(a - 0.5)
        return "no" if d < 0.05 else "weak" if d < 0.15 else "moderate" if d < 0.3 else "strong"

    lines = [f"- GNQ: {strength(gnq_auc)} separation at the last epoch (AUC {rep.fmt(gnq_auc)}"
             + ("; claims score *lower* than facts)" if gnq_auc < 0.45 else ")") + ".",
             f"- Counterfactual memorization: {strength(cf_auc)} separation (AUC {rep.fmt(cf_auc)}).",
             f"- Loss: AUC {rep.fmt(loss_auc)} — the facts were in the pretraining data, so a loss gap "
             "is expected; it measures fit, not what the update encodes."]
    if not (np.isnan(gnq_auc) or np.isnan(cf_auc)):
        more = abs(gnq_auc - 0.5) > abs(cf_auc - 0.5)
        lines.append(f"- As point estimates GNQ's AUC is {'further from' if more else 'closer to'} 0.5 than "
                     "counterfactual memorization's; the paper's claim (GNQ separates more) is judged with "
                     "the intervals below.")
    return "\n".join(lines)
