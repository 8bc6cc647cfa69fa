"""Leave-half-out membership: which signal predicts that a model learned a text?

N models are trained from scratch with in-run GNQ (``pipelines.train``, the engine's own loop),
model 2q and 2q+1 on the two complementary halves of one seeded permutation of the texts
(``common_knowledge.cf_subset``).  Every model's last checkpoint scores every text forward only
(loss, Min-K%, Min-K%++, zlib ratio), so each text is a member of half the models and a
non-member of the other half.

* **Membership AUC per model** — members vs non-members of that model, per forward signal, with
  a 95% interval over records (near copies resampled together, ``analysis.clusters``).
* **Per-text separation** — mean loss under the models that did *not* train on the text minus
  mean loss under those that did (nats): how much training on this text lowered its loss, the
  per-text quantity the paper's bound is about.  Each candidate signal is read where a user has
  it, from the runs that trained on the text (averaged over them): GNQ summed over epochs, K_jj
  and the gradient norm at the last epoch, the last in-run loss, the loss ratio to the first
  epoch, Min-K%++ and Min-K% at the last epoch, zlib ratio, copies.  Spearman ρ with a 95%
  interval over records (near copies resampled together).  No signal sees the out-models.
* **Canaries** (``--canaries K``, off by default): K canaries per repetition count 1, 2, 4, 8
  are added to every model's training half (``attacks.canaries``); each one's exposure among
  1,000 random candidates at the last epoch, beside its in-run GNQ and K_jj.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.partial import partial_rank_correlation
from gnq_core.attacks.canaries import REPETITIONS, Canary, exposure, inserted, random_secret
from gnq_core.attacks.compression import zlib_bits
from gnq_core.common.atomic import write_text_atomic
from gnq_core.common.runtime import resolve_device
from gnq_core.pipelines.settings import TrainSettings
from gnq_core.pipelines.train import run_training
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.copies import find_copies
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.tokens import encode_texts, pad_id
from research.studies import report as rep
from research.studies.base import StudyContext, Timings, ag_news, same_settings_or_tag, write_dataset
from research.studies.counterfactual import cf_subset
from research.studies.signals import forward_signals

STUDY = "membership"


@dataclass(frozen=True)
class Config:
    texts: int
    models: int
    epochs: int
    preset: str
    batch_size: int
    lr: float
    max_length: int


QUICK = Config(texts=64, models=2, epochs=6, preset="tiny", batch_size=8, lr=3e-3, max_length=32)
FULL = Config(texts=240, models=4, epochs=6, preset="small", batch_size=16, lr=1e-3, max_length=48)
PAPER = Config(texts=2000, models=16, epochs=10, preset="gpt2-small", batch_size=16, lr=3e-4, max_length=64)
# Forward signals scored on members vs non-members: (column, label, higher means member).
FORWARD = [("loss", "loss", False), ("min_k", "Min-K%", True), ("min_k_plus", "Min-K%++", True),
           ("zlib_ratio", "zlib ratio", False)]
# Per-text candidates for the separation: (column, label).
CANDIDATES = [("gnq_total", "GNQ_total (in-run)"), ("self_influence", "K_jj (last epoch)"),
              ("grad_norm", "gradient norm √K_jj"), ("loss_last", "loss (in-run, last)"),
              ("loss_ratio", "loss ratio to epoch 1"), ("min_k_plus", "Min-K%++ (last)"),
              ("min_k", "Min-K% (last)"), ("zlib_ratio", "zlib ratio (last)"), ("copies", "copies")]


def make_canaries(per_level: int, seed: int, digits: int = 6,
                  repetitions: Sequence[int] = REPETITIONS) -> list[Canary]:
    """``per_level`` distinct canaries for each repetition count (seeded)."""
    rng = np.random.default_rng([seed, 2019])
    out, seen = [], set()
    for r in repetitions:
        while sum(c.repetitions == r for c in out) < per_level:
            canary = Canary(int(rng.integers(100, 1000)), random_secret(rng, digits), r)
            if canary.locker not in seen:
                seen.add(canary.locker)
                out.append(canary)
    return out


def run(ctx: StudyContext, models: int | None = None, canaries: int = 0) -> Path:
    cfg = ctx.pick(QUICK, FULL, PAPER)
    if models is not None:
        cfg = replace(cfg, models=models)
    if cfg.models < 2 or cfg.models % 2:
        raise ValueError(f"--models must be even and at least 2 (complementary halves), got {cfg.models}")
    work = ctx.work_dir(STUDY)
    timings = Timings(work)
    texts = [t for t, _ in ag_news(ctx.shared_data(), cfg.texts)]
    settings = TrainSettings(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, lam=1e-2,
                             max_length=cfg.max_length, seed=ctx.seed, preset=cfg.preset,
                             vocab_size=2048, device=ctx.device)
    planted = make_canaries(canaries, ctx.seed) if canaries else []
    per_model = [_model(ctx, cfg, settings, texts, m, work, timings, planted) for m in range(cfg.models)]
    frames = [_text_rows(ctx, r, texts) for r in per_model]
    groups = find_copies(texts)["cluster_id"].to_numpy().astype(float)  # near copies: one record
    aucs = membership_aucs(frames, ctx.seed, groups)
    per_text = separation(frames, len(texts))
    rho = spearman_table(per_text, ctx.seed, groups=groups)
    canary_rows = pd.DataFrame([c for r in per_model for c in r.get("canaries", [])])
    return _write(ctx, cfg, aucs, per_text, rho, timings, canary_rows)


def _model(ctx: StudyContext, cfg: Config, settings: TrainSettings, texts: list[str], m: int, work: Path,
           timings: Timings, canaries: list[Canary]) -> dict:
    """Train model m on its half (resumes) and score every text at its last epoch (cached)."""
    subset = cf_subset(len(texts), m, ctx.seed)
    cache = work / f"model-{m:02d}.json"
    name = f"{ctx.label(STUDY)}.model-{m:02d}"
    train_texts = inserted([texts[i] for i in subset], canaries)
    data = write_dataset(work / f"model-{m:02d}.csv", train_texts,
                         ["member"] * len(subset) + ["canary"] * (len(train_texts) - len(subset)))
    with timings.stage("train (in-run GNQ)"), ctx.reporter(name) as r, same_settings_or_tag():
        trained = run_training(ctx.store, load_texts(data), work / f"model-{m:02d}", name=name,
                               settings=settings, reporter=r)
    if cache.is_file():
        saved = json.loads(cache.read_text(encoding="utf-8"))
        if saved["subset"] == subset and saved["run_id"] == trained.run_id:
            return saved
    with timings.stage("score all texts (forward)"):
        device = resolve_device(ctx.device)
        model, tokenizer = load_checkpoint(work / f"model-{m:02d}" / f"epoch-{cfg.epochs}", device=device)
        ids = encode_texts(tokenizer, texts, cfg.max_length)
        scored = forward_signals(model, ids, pad_id(tokenizer), batch_size=64, device=device)
        scored["n_tokens"] = [len(x) for x in ids]
        saved = {"model": m, "subset": subset, "run_id": trained.run_id, "name": name,
                 **{c: scored[c].tolist() for c in scored.columns},
                 "canaries": _canary_rows(ctx, trained.run_id, model, tokenizer, canaries, len(subset), m,
                                          cfg.max_length)}
    write_text_atomic(cache, json.dumps(saved))
    return saved


def _canary_rows(ctx: StudyContext, run_id: int, model, tokenizer, canaries: list[Canary], first: int,
                 m: int, max_length: int) -> list[dict]:
    """Per canary: exposure at the last epoch, and its copies' in-run GNQ_total and last K_jj (means)."""
    if not canaries:
        return []
    totals = ctx.store.example_totals(run_id).set_index("example_id").sort_index()
    values = exposure(model, tokenizer, canaries, seed=ctx.seed + m, max_length=max_length)
    rows, at = [], first
    for canary, value in zip(canaries, values, strict=True):
        copies = totals.loc[at: at + canary.repetitions - 1]
        at += canary.repetitions
        rows.append({"model": m, "repetitions": canary.repetitions, "locker": canary.locker,
                     "exposure": value, "gnq_total": float(copies["gnq_total"].mean()),
                     "self_influence": float(copies["self_influence_last"].mean())})
    return rows


def _text_rows(ctx: StudyContext, saved: dict, texts: list[str]) -> pd.DataFrame:
    """One model: every text's forward signals and membership, plus (members only) the in-run
    signals of its training run."""
    n = len(texts)
    frame = pd.DataFrame({"text_id": np.arange(n), "model": saved["model"],
                          "outcome": np.isin(np.arange(n), saved["subset"]),
                          **{c: saved[c] for c in ("loss", "min_k", "min_k_plus", "n_tokens")}})
    frame["zlib_ratio"] = (frame["loss"] * (frame["n_tokens"] - 1).clip(lower=1) / math.log(2)
                           / [zlib_bits(t) for t in texts])
    store, run_id = ctx.store, saved["run_id"]
    scores = store.scores(run_id)
    first, last = scores["point"].min(), scores["point"].max()
    at_last = scores[scores["point"] == last].set_index("example_id")
    at_first = scores[scores["point"] == first].set_index("example_id")
    inrun = pd.DataFrame({
        "gnq_total": scores.groupby("example_id")["gnq"].sum(min_count=1),
        "self_influence": at_last["self_influence"], "grad_norm": np.sqrt(at_last["self_influence"]),
        "loss_last": at_last["loss"], "loss_ratio": at_last["loss"] / at_first["loss"],
        "min_k_plus_inrun": at_last.get("min_k_plus"), "min_k_inrun": at_last.get("min_k"),
        "copies": store.examples(run_id).set_index("example_id")["copies"]})
    inrun = inrun[inrun.index < len(saved["subset"])]  # canaries come after the subset's texts
    inrun.index = [saved["subset"][i] for i in inrun.index]  # the run's ids are positions in the subset
    return frame.join(inrun, on="text_id")


def membership_aucs(frames: list[pd.DataFrame], seed: int, groups: np.ndarray | None = None) -> pd.DataFrame:
    """Per model and forward signal: AUC of members vs non-members with its interval (copy clusters
    ``groups``, indexed by text id, resampled together; NaN under ``clusters.MIN_RECORDS``
    independent records of either side), and TPR at 1% / 10% FPR."""
    rows = []
    for frame in frames:
        y = frame["outcome"].to_numpy(bool)
        g = None if groups is None else np.asarray(groups)[frame["text_id"].to_numpy()]
        for column, label, higher in FORWARD:
            s = frame[column].to_numpy(float) * (1 if higher else -1)
            keep = np.isfinite(s)
            point = pr.metrics_matrix(s[keep], y[keep], fractions=())  # TPR at 0.1%, 1%, 10% FPR (LiRA)
            lo, hi = rep.auc_interval(s[keep], y[keep], seed, None if g is None else g[keep])
            rows.append({"model": int(frame["model"].iloc[0]), "signal": label, "n": int(keep.sum()),
                         "members": int(y[keep].sum()), "auc": float(point["auc"][0]), "auc lo": lo,
                         "auc hi": hi, **{k: float(v[0]) for k, v in point.items() if k.startswith("tpr")}})
    return pd.DataFrame(rows)


def separation(frames: list[pd.DataFrame], n: int) -> pd.DataFrame:
    """Per text: out-model mean loss − in-model mean loss, and each candidate signal averaged over
    the models that trained on it."""
    both = pd.concat(frames, ignore_index=True)
    mean = both.groupby(["text_id", "outcome"])["loss"].mean().unstack()
    out = pd.DataFrame({"text_id": np.arange(n)})
    out["separation"] = (mean[False] - mean[True]).reindex(out["text_id"]).to_numpy()
    members = both[both["outcome"]].copy()
    members["min_k_plus"], members["min_k"] = members["min_k_plus_inrun"], members["min_k_inrun"]
    columns = [c for c, _ in CANDIDATES]
    return out.join(members.groupby("text_id")[columns].mean(), on="text_id")


def spearman_table(per_text: pd.DataFrame, seed: int, resamples: int = pr.RESAMPLES,
                   groups: np.ndarray | None = None) -> pd.DataFrame:
    """Spearman ρ of each candidate with the separation, 95% interval over records (copy clusters
    ``groups``, indexed by text id, resampled together; ``analysis.partial`` without covariates);
    NaN under ``clusters.MIN_RECORDS`` effective records."""
    rows = []
    for column, label in CANDIDATES:
        part = per_text[["text_id", "separation", column]].apply(pd.to_numeric, errors="coerce").dropna()
        x, y = part[column].to_numpy(float), part["separation"].to_numpy(float)
        g = None if groups is None else np.asarray(groups)[part["text_id"].to_numpy(int)]
        if len(part) < 3 or np.ptp(x) == 0 or cl.kish(g, len(part)) < cl.MIN_RECORDS:
            rows.append({"signal": label, "column": column, "n": len(part), "rho": math.nan,
                         "rho lo": math.nan, "rho hi": math.nan})
            continue
        rho = partial_rank_correlation(x, y, [], groups=g, resamples=resamples, seed=seed)
        rows.append({"signal": label, "column": column, "n": len(part),
                     "rho": float(spearmanr(x, y).statistic), "rho lo": rho.lo, "rho hi": rho.hi,
                     "records": rho.records})
    return pd.DataFrame(rows)


def _write(ctx: StudyContext, cfg: Config, aucs: pd.DataFrame, per_text: pd.DataFrame, rho: pd.DataFrame,
           timings: Timings, canaries: pd.DataFrame) -> Path:
    r = rep.Report(ctx.report_dir(STUDY), "Membership: which signal predicts that a model learned a text?")
    r.text(rep.scale_banner(ctx, f"GPT-2 preset {cfg.preset!r} from scratch, {cfg.models} models on halves "
                                 f"of {len(per_text)} AG News texts, {cfg.epochs} epochs"))
    r.text(__doc__.split("\n\n", 1)[1])
    mean = aucs.groupby("signal", sort=False)[["auc", "auc lo", "auc hi"]].mean().reset_index()
    shown = aucs.assign(**{"AUC [95% CI]": rep.ci_column(aucs, "auc")})
    r.text("## Membership AUC per model (members vs non-members of that model, last epoch)")
    tprs = [f"tpr@{a:g}" for a in pr.FPR_LEVELS]
    r.table(shown[["model", "signal", "n", "members", "AUC [95% CI]", *tprs]],
            caption="Intervals: 95% expanded percentile intervals over copy clusters (near copies "
                    "resampled together; members and non-members separately; n/a under 10 independent "
                    "records). tpr@α: share of members caught while flagging at most α of the "
                    "non-members (with n/2 non-members, α below 2/n is reached only by a threshold above "
                    "every non-member). The mean over models follows.")
    r.table(mean.rename(columns={"auc": "mean AUC", "auc lo": "mean lo", "auc hi": "mean hi"}))
    r.text("## What predicts the per-text separation (out-model loss − in-model loss)")
    shown = rho.assign(**{"Spearman ρ [95% CI]": rep.ci_column(rho, "rho")})
    r.table(shown[["signal", "n", "Spearman ρ [95% CI]"]],
        caption=f"Separation: mean {rep.fmt(per_text['separation'].mean())} nats over texts. Intervals: "
                "95% over copy clusters (near copies resampled together). Signals are averaged over the "
                "models that trained on the text.")
    if not canaries.empty:
        r.text("## Canaries: exposure by repetitions")
        by = canaries.groupby("repetitions").agg(canaries=("exposure", "size"), exposure=("exposure", "mean"),
                                                 lowest=("exposure", "min"), highest=("exposure", "max"),
                                                 gnq_total=("gnq_total", "mean"),
                                                 k_jj=("self_influence", "mean")).reset_index()
        r.table(by, caption="Exposure among 1,000 random candidates (maximum log2 1001 ≈ 9.97), mean and "
                            "range over canaries × models; GNQ_total and K_jj: means over the canaries' "
                            "copies (in-run).")
    return r.write({"config": cfg.__dict__, "aucs": aucs.to_dict("records"),
                    "canaries": canaries.to_dict("records"),
                    "spearman": rho.to_dict("records"),
                    "separation_mean": float(per_text["separation"].mean())},
                   command=ctx.command, timings=timings, device=ctx.device)
