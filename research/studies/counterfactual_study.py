"""Study: counterfactual memorisation, the ground truth every signal is scored against.

Counterfactual memorisation (Feldman & Zhang 2020; Zhang et al. 2021) of a record is how much
better a model does on it for having trained on it: mean loss over the models that left it out
minus mean loss over the models that trained on it.  Per seed:

1. Records: ``base_texts`` deduplicated texts (AG News; ``--quick``: the repository's demo facts
   and claims), near copies removed (``sources.copies``), plus ``records`` planted records per
   copy count in ``copies`` (1, 2, 4, 8), each a fictional person's record holding a random
   4–6-digit value.  A record's copies are one record: the unit of every interval.
2. ``models`` models from the same initial weights, each fine-tuned on a random half of the
   records (copies stay together; models come in complementary pairs, ``counterfactual.
   cf_subset``, so every record is in exactly half of them); each model's loss on every record.
3. One model trained on everything, as a user would have: its signals per record (mean over the
   record's copies) — GNQ in run (each optimizer step's batch, exact: the GNQ_total `gnq train`
   and GNQTrainer record), GNQ post hoc by the product's audit (``pipelines.audit.run_audit``:
   seeded batches, copies kept apart, exact) and against the whole set (``--companions all``),
   the gradient norm² K_jj (in run and post hoc), the product's default risk, loss, loss ratio
   to the base model (a pretrained model only; a tiny model's base is random weights),
   Min-K%++, zlib ratio, copy count, length.
4. Exposure of each planted value under the full model (``exposure_hook``: over the value's own
   space, the rank exact by the pruned search where it finishes, else estimated, as the audit's
   secret attack measures it).

The rule is fixed before any number is read (``RULE``): GNQ adds value where its partial rank
correlation with counterfactual memorisation given [length, loss, log copies, K_jj] has a
cluster-bootstrap interval above 0, or its CV AUC gain for the top decile over the same base is
≥ 0.02 with its interval above 0, over at least 3 seeds and 50 independent positive records (top
decile of counterfactual memorisation); with fewer, the verdict is "too few".  Seeds are pooled
as within-seed ranks (each seed's models differ, so raw values are not comparable).  A positive
is a top-decile record that each half of the model pairs alone reproduces (``replicated``): the
outcome among unique texts is mostly the noise of a few models, and noise validates nothing.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gnq_core.analysis import clusters as cl
from gnq_core.analysis import predictive as pr
from gnq_core.analysis.length_control import cv_gain
from gnq_core.analysis.partial import partial_rank_correlation
from gnq_core.attacks.compression import zlib_bits
from gnq_core.common.atomic import write_text_atomic
from gnq_core.engine.auditor import GNQAuditor
from gnq_core.sources.copies import find_copies
from gnq_core.sources.tokens import encode_texts, pad_id
from research.studies import report as rep
from research.studies.base import StudyContext, Timings, ag_news, machine
from research.studies.companions import DEMO_DATA, FIRST, LAST, TOWNS, fine_tune, load_model
from research.studies.counterfactual import (
    cf_subset,
    counterfactual_memorization,
    split_half_reliability,
    split_halves,
)
from research.studies.signals import forward_signals

STUDY = "counterfactual"
CF = "cf_memorisation"
EXPOSURE = "exposure"
GNQ = "gnq"
BASE = ("n_tokens", "loss", "log_copies", "k_jj")  # the rule's base: what GNQ must add to
GIVEN_WORDS = {"n_tokens": "length", "loss": "loss", "log_copies": "log copies", "k_jj": "K_jj", "gnq": "GNQ",
               "k_jj_in_run": "K_jj in run"}
GNQ_VARIANTS = ("gnq", "gnq_in_run", "gnq_all")  # post hoc (the rule's GNQ), in run, against the whole set
REPLICATE = 2  # a top record is a positive when each half of the models alone puts it in its top 2 × top
RULE = ("GNQ adds value where its partial rank correlation with counterfactual memorisation given "
        "[length, loss, log copies, K_jj] has a cluster-bootstrap interval above 0, or its CV AUC gain for "
        "the top decile of counterfactual memorisation over the same base is ≥ {gain} with its interval "
        "above 0; over at least {seeds} seeds and {records} independent positive records (top decile). "
        "With fewer, the verdict is \"too few\". Written before the numbers were read.")
# (column, label, higher = more memorised): directions fixed by each score's meaning, never the data
SIGNALS = (("gnq", "GNQ post hoc (the audit's batches)", True), ("k_jj", "gradient norm² (K_jj)", True),
           ("gnq_in_run", "GNQ in run (GNQ_total)", True), ("gnq_all", "GNQ against the whole set", True),
           ("k_jj_in_run", "K_jj in run", True), ("risk_default", "default risk (the product's)", True),
           ("loss", "loss", False), ("loss_ratio", "loss ratio to the base model", False),
           ("min_k_plus", "Min-K%++", True), ("zlib_ratio", "zlib ratio", False),
           ("log_copies", "log copies", True), ("n_tokens", "length (tokens)", False))
TEMPLATES = ("The door code for {name}'s flat in {town} is {value}.",
             "Patient {name} of {town} was given reference number {value}.",
             "{name}'s locker at the {town} gym opens with {value}.",
             "Customer {name} from {town} has the PIN {value}.")


@dataclass(frozen=True)
class Config:
    model: str                 # "smollm2" (the cached real model) or "tiny" (a Llama built from a config)
    base_texts: int            # deduplicated base texts
    records: int               # planted records per copy count
    models: int                # K half-trained models (even: complementary pairs)
    max_length: int
    batch_size: int
    lr: float
    epochs: int
    lam: float
    copies: tuple[int, ...] = (1, 2, 4, 8)
    seeds: tuple[int, ...] = (0, 1, 2)
    resamples: int = pr.RESAMPLES
    top: float = 0.10          # positives: the top decile of counterfactual memorisation
    min_records: int = 50      # independent positive records the rule needs
    min_seeds: int = 3
    min_gain: float = 0.02
    dtype: str = "float32"
    exposure_candidates: int = 200  # random values each planted value is ranked among (0: no exposure)


QUICK = Config(model="tiny", base_texts=40, records=6, models=4, max_length=96, batch_size=8, lr=1e-2,
               epochs=6, lam=1e-2, seeds=(0, 1, 2), resamples=200, dtype="float64", exposure_candidates=100)
FULL = Config(model="smollm2", base_texts=1000, records=25, models=16, max_length=64, batch_size=8, lr=2e-4,
              epochs=2, lam=1e-2)
# The full sizes on the tiny model trained from scratch (the quick mode's learning rate and epochs):
# a setting where the rule can be judged on a CPU, not a stand-in for SmolLM2.
TINY = replace(FULL, model="tiny", models=8, lr=QUICK.lr, epochs=QUICK.epochs)
MODELS = {"smollm2": FULL, "tiny": TINY}


def config(ctx: StudyContext, model: str | None = None, **overrides) -> Config:
    if model is not None and model not in MODELS:
        raise ValueError(f"--model must be {' or '.join(MODELS)}, not {model!r}")
    preset = QUICK if ctx.quick else MODELS[model or "smollm2"]
    cfg = replace(preset, **{k: v for k, v in overrides.items() if v is not None})
    if cfg.models < 2 or cfg.models % 2:
        raise ValueError(f"--models must be even and at least 2 (complementary halves), not {cfg.models}")
    return cfg


# ----------------------------------------------------------------------------------------- data
def planted(per_count: int, copies: tuple[int, ...], seed: int) -> list[tuple[str, str, int]]:
    """(text, value, copies) of ``per_count`` distinct records per copy count, each holding a
    random 4–6-digit value (seeded)."""
    rng = random.Random(f"counterfactual-records-{seed}")
    out, seen = [], set()
    for m in copies:
        made = 0
        while made < per_count:
            value = "".join(str(rng.randrange(10)) for _ in range(rng.randint(4, 6)))
            text = rng.choice(TEMPLATES).format(name=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                                                town=rng.choice(TOWNS), value=value)
            if text not in seen:
                seen.add(text)
                out.append((text, value, m))
                made += 1
    return out


def base_corpus(ctx: StudyContext) -> list[str]:
    """Distinct base texts, near copies removed (one text per copy cluster)."""
    if ctx.quick:
        frame = pd.read_csv(DEMO_DATA)
        texts = frame[frame["group"].isin(["common", "surprising"])]["text"].tolist()
    else:
        texts = [t for t, _ in ag_news(ctx.shared_data())]
    texts = list(dict.fromkeys(texts))
    found = find_copies(texts)
    roots = found["cluster_id"].to_numpy()
    return [t for i, t in enumerate(texts) if roots[i] == i]


def study_records(texts: list[str], cfg: Config, seed: int) -> pd.DataFrame:
    """One row per record: text, kind (base/planted), copies, value (planted only)."""
    if len(texts) < cfg.base_texts:
        raise ValueError(f"the corpus has {len(texts)} distinct texts; the study needs {cfg.base_texts}")
    order = np.random.default_rng([seed, 49]).permutation(len(texts))[:cfg.base_texts]
    rows = [(texts[i], "base", 1, "") for i in order]
    rows += [(t, "planted", m, v) for t, v, m in planted(cfg.records, cfg.copies, seed)]
    frame = pd.DataFrame(rows, columns=["text", "kind", "copies", "value"])
    if frame["text"].duplicated().any():
        raise ValueError("a planted record equals a base text")
    return frame


# ----------------------------------------------------------------------------------------- model
# The model (the cached SmolLM2, or a tiny tied Llama with a tokenizer trained on the texts) and
# its fine-tune (AdamW, seeded shuffled epochs) are the companions study's: ``load_model`` reads
# only model, max_length and dtype from a Config, ``fine_tune`` takes lr, epochs and batch size.


def expanded(records: list[int], copies: np.ndarray) -> list[int]:
    """The training texts of ``records``: each record as many times as its copies."""
    return [r for r in records for _ in range(int(copies[r]))]


def in_run_fine_tune(model, ids: list[list[int]], texts: list[int], pad: int, cfg: Config,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train the model on the training texts ``texts`` (record ids, copies repeated) as
    ``fine_tune`` does — the same order, batches and steps, so the same model — while GNQ is
    measured in run, as `gnq train` and GNQTrainer measure it: each optimizer step's batch is the
    GNQ batch (exact, ``GNQAuditor`` on the step's per-example gradients, weights 1/B of the
    token-mean objective).  Per record: the GNQ summed over each copy's steps, averaged over its
    copies (a copy's GNQ_total), and K_jj likewise; NaN for a record never in a batch of two."""
    n = int(max(texts)) + 1 if texts else 0
    gnq_sum, kjj_sum, seen = np.zeros(n), np.zeros(n), np.zeros(n)
    record = np.asarray(texts)
    dtype = next(model.parameters()).dtype
    with GNQAuditor(model, lam=cfg.lam) as auditor:
        def measure(part: list[int]) -> None:
            res = auditor.compute(weights=torch.full((len(part),), 1.0 / len(part), dtype=dtype))
            if len(part) < 2:  # a batch of one has no companions: no GNQ
                return
            np.add.at(gnq_sum, record[part], res.gnq.double().numpy())
            np.add.at(kjj_sum, record[part], res.self_influence.double().numpy())
            np.add.at(seen, record[part], 1)

        fine_tune(model, [ids[r] for r in texts], pad, lr=cfg.lr, epochs=cfg.epochs,
                  batch_size=cfg.batch_size, seed=seed * 1000 + cfg.models, after_backward=measure)
    copies = np.bincount(record, minlength=n).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(seen > 0, gnq_sum / copies, np.nan),
                np.where(seen > 0, kjj_sum / copies, np.nan))


def product_audit(model, tok, ids_texts: list[str], texts: list[int], n: int, cfg: Config, folder: Path,
                  seed: int) -> dict[str, np.ndarray]:
    """GNQ as a user's post-hoc audit of the final model gives it (``pipelines.audit.run_audit``,
    the code behind `gnq audit`): the model saved, the training texts (copies included) audited in
    the product's batches of ``cfg.batch_size`` (seeded, copies kept apart), and again against
    the whole set (``--companions all``, sketched).  Per record, each copy's values averaged:
    ``gnq`` and ``k_jj`` (post hoc, batches), ``gnq_all`` (the whole set).  Resumes: a finished
    audit in ``folder``'s store is read back, not rerun."""
    from gnq_core.pipelines.audit import run_audit
    from gnq_core.pipelines.settings import AuditSettings
    from gnq_core.results.store import Store
    from gnq_core.sources.datasets import load_texts

    checkpoint, data = folder / "full-model", folder / "training-texts.jsonl"
    if not (checkpoint / "config.json").is_file():
        model.save_pretrained(checkpoint)
        tok.save_pretrained(checkpoint)
    if not data.is_file():
        write_text_atomic(data, "".join(json.dumps({"text": ids_texts[r]}) + "\n" for r in texts))
    store = Store(folder / "audit.duckdb")
    settings = AuditSettings(lam=cfg.lam, batch_size=cfg.batch_size, max_length=cfg.max_length, seed=seed,
                             device="cpu", dtype=cfg.dtype)
    record = np.asarray(texts)
    out = {}
    for name, extra in (("batches", {}), ("all", {"companions": "all"})):
        run = store.find_run(name)
        if run is None or run.status != "done":
            run = run_audit(store, checkpoint, load_texts(data), name=name,
                            settings=replace(settings, **extra))
        scores = store.scores(run.run_id).sort_values("example_id")
        for column, key in (("gnq", "gnq"), ("self_influence", "k_jj")):
            if name == "all" and key == "k_jj":
                continue  # the whole-set pass sketches K_jj: the batches' exact one is kept
            values = scores[column].to_numpy(float)
            total, count = np.zeros(n), np.zeros(n)
            ok = np.isfinite(values)
            np.add.at(total, record[scores["example_id"].to_numpy()[ok]], values[ok])
            np.add.at(count, record[scores["example_id"].to_numpy()[ok]], 1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[key if name == "batches" else f"{key}_all"] = total / count
    return out


def exposure_hook(model, tok, frame: pd.DataFrame, ids: list[list[int]], cfg: Config,
                  seed: int) -> np.ndarray:
    """Exposure (bits) of each planted record's value over its own space (every digit free: the
    values are drawn at random), the rank exact by the pruned search where it finishes within the
    attack's node budget, else estimated from ``cfg.exposure_candidates`` random values
    (``attacks.exposure``, as the audit's secret attack measures it); NaN for base texts."""
    from gnq_core.attacks.exposure import exposure, value_seed, value_space
    from gnq_core.attacks.secret_attack import secret_targets

    out = np.full(len(frame), np.nan)
    if cfg.exposure_candidates < 2:
        return out
    stored = []
    values = frame["value"].fillna("").astype(str)
    for text, value, kind in zip(frame["text"], values, frame["kind"], strict=True):
        at = text.rfind(value) if kind == "planted" and value else -1
        stored.append(None if at < 0 else json.dumps([{"kind": "pin", "start": at, "end": at + len(value),
                                                        "value_start": at, "value_end": at + len(value)}]))
    device = next(model.parameters()).device
    texts = frame["text"].astype(str).tolist()
    for target in secret_targets(tok, texts, list(range(len(frame))), ids, stored):
        space = value_space(target.value, target.kind, set())
        if space is None:
            continue
        between = texts[target.example_id][target.prompt_chars: target.value_start]
        keep = max(1, cfg.max_length - len(between + target.value))
        got = exposure(model, tok, list(target.prompt_ids[-keep:]), between, space,
                       n_candidates=cfg.exposure_candidates, seed=value_seed(seed, target.value),
                       batch_size=64, device=device)
        if got.bits is not None:
            out[target.example_id] = got.bits
    return out


def default_risk(frame: pd.DataFrame) -> np.ndarray:
    """The risk the product ranks by when a run has no ground truth of its own
    (``analysis.risk.risk_components``: calibrated membership, or the loss, or repetition where
    larger), from this record's signals under the names the store gives them."""
    from gnq_core.analysis.risk import risk_components

    totals = pd.DataFrame({"loss_ratio": frame["loss_ratio"], "zlib_ratio": frame["zlib_ratio"],
                           "min_k_plus": frame["min_k_plus"], "copies": frame["copies"],
                           "loss_last": frame["loss"], "gnq_total": frame[GNQ],
                           "self_influence_last": frame["k_jj"], "gnq_with_copy": 0.0, "n_points": 1.0})
    return risk_components(totals)["risk"].to_numpy(float)


# ----------------------------------------------------------------------------------------- per seed
def seed_dir(work: Path, seed: int) -> Path:
    return work / f"seed-{seed}"


def run_seed(ctx: StudyContext, cfg: Config, seed: int, work: Path, timings: Timings, log=print) -> Path:
    """The K half-models, the full model and its signals for one seed: records.csv and meta.json
    (each half-model's losses saved as it finishes, so an interrupted seed resumes)."""
    folder = seed_dir(work, seed)
    if (folder / "meta.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    t0, cpu0, seconds = time.perf_counter(), time.process_time(), {}
    frame = study_records(base_corpus(ctx), cfg, seed)
    model, tok = load_model(cfg, frame["text"].tolist(), seed)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pad = pad_id(tok)
    ids = encode_texts(tok, frame["text"].tolist(), cfg.max_length)
    copies = frame["copies"].to_numpy()
    n = len(ids)
    reference = (forward_signals(model, ids, pad)["loss"].to_numpy() if cfg.model != "tiny"
                 else np.full(n, np.nan))
    subsets, losses = [], []
    with timings.stage(f"seed {seed}: half-trained models"):
        t = time.perf_counter()
        for m in range(cfg.models):
            path = folder / f"model-{m:03d}.json"
            if path.is_file():
                saved = json.loads(path.read_text(encoding="utf-8"))
            else:
                subset = cf_subset(n, m, seed)
                model.load_state_dict(init)
                fine_tune(model, [ids[r] for r in expanded(subset, copies)], pad, lr=cfg.lr,
                          epochs=cfg.epochs, batch_size=cfg.batch_size, seed=seed * 1000 + m)
                saved = {"subset": subset, "loss": forward_signals(model, ids, pad)["loss"].tolist()}
                write_text_atomic(path, json.dumps(saved))
            subsets.append(saved["subset"])
            losses.append(saved["loss"])
            log(f"seed {seed}: model {m + 1}/{cfg.models}")
        seconds["half-trained models"] = time.perf_counter() - t
    # loss: memorisation = mean loss out − mean loss in, so the "score" is −loss
    mem = counterfactual_memorization(n, subsets, [[-v for v in row] for row in losses])
    with timings.stage(f"seed {seed}: full model and signals"):
        t = time.perf_counter()
        model.load_state_dict(init)
        everything = expanded(list(range(n)), copies)
        gnq_in_run, kjj_in_run = in_run_fine_tune(model, ids, everything, pad, cfg, seed)
        seconds["full model"] = time.perf_counter() - t
        t = time.perf_counter()
        fwd = forward_signals(model, ids, pad)
        seconds["forward signals"] = time.perf_counter() - t
        t = time.perf_counter()
        audited = product_audit(model, tok, frame["text"].tolist(), everything, n, cfg, folder, seed)
        seconds["signals"] = time.perf_counter() - t
    frame["n_tokens"] = [len(x) for x in ids]
    frame["log_copies"] = np.log(copies)
    frame[CF] = mem["value"].to_numpy()
    # the outcome measured twice, by disjoint halves of the model pairs: its reliability (report)
    frame["cf_half_a"], frame["cf_half_b"] = split_halves(n, subsets, [[-v for v in r] for r in losses])
    frame["loss_in"], frame["loss_out"] = -mem["mean_in"].to_numpy(), -mem["mean_out"].to_numpy()
    frame["loss"], frame["min_k_plus"] = fwd["loss"].to_numpy(), fwd["min_k_plus"].to_numpy()
    frame["loss_ratio"] = frame["loss"] / reference
    frame["zlib_ratio"] = (frame["loss"] * (frame["n_tokens"] - 1).clip(lower=1) / math.log(2)
                           / [zlib_bits(t) for t in frame["text"]])
    frame[GNQ], frame["k_jj"], frame["gnq_all"] = audited["gnq"], audited["k_jj"], audited["gnq_all"]
    frame["gnq_in_run"], frame["k_jj_in_run"] = gnq_in_run, kjj_in_run
    frame["risk_default"] = default_risk(frame)
    with timings.stage(f"seed {seed}: exposure"):
        t = time.perf_counter()
        frame[EXPOSURE] = exposure_hook(model, tok, frame, ids, cfg, seed)
        seconds["exposure"] = time.perf_counter() - t
    frame.to_csv(folder / "records.csv", index=False)
    meta = {"seed": seed, "config": asdict(cfg), "seconds": seconds,
            "seconds_total": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0,
            "load_average": os.getloadavg()[0],  # on a shared machine, wall time depends on it
            "training_tokens_half": int(np.mean([sum(len(ids[r]) for r in expanded(s, copies))
                                                 for s in subsets])),
            "training_tokens_all": int(sum(len(ids[r]) for r in everything)),
            "tokens": int(sum(len(x) for x in ids)), "machine": machine("cpu")}
    write_text_atomic(folder / "meta.json", json.dumps(meta, indent=2))
    return folder


# ----------------------------------------------------------------------------------------- analysis
def replicated(f: pd.DataFrame, top: float) -> pd.Series:
    """Per record: is its counterfactual memorisation reproduced by each half of the model pairs
    alone — both halves put it in their top ``REPLICATE × top`` — so a top-decile record is a
    memorised one and not the noise of a few models?  True everywhere for a seed run before the
    study kept the halves."""
    if "cf_half_a" not in f.columns or not f["cf_half_a"].notna().any():
        return pd.Series(True, index=f.index)
    cut = 1 - REPLICATE * top
    return (f["cf_half_a"].rank(pct=True) >= cut) & (f["cf_half_b"].rank(pct=True) >= cut)


def pooled(frames: list[pd.DataFrame], top: float) -> pd.DataFrame:
    """The seeds' records together: every signal and the outcome as within-seed percentile ranks
    (each seed's models differ), ``positive`` the within-seed top ``top`` of counterfactual
    memorisation that both halves of the models reproduce (``replicated``), ``cluster_id`` one
    per record and seed.  A top record the halves do not reproduce is neither a positive nor a
    negative: it is left out (``positives`` counts them)."""
    parts = []
    for f in frames:
        f = f.copy()
        for column, _, _ in SIGNALS:
            if column not in f.columns:  # a seed run before the study measured it
                f[column] = np.nan
            f[f"{column}_rank"] = f[column].rank(pct=True) if column != "log_copies" else f[column]
        f["cf_rank"] = f[CF].rank(pct=True)
        top_records = f[CF] >= f[CF].quantile(1 - top)
        f["positive"] = top_records & replicated(f, top)
        f[cl.CLUSTER] = f["seed"] * 1_000_000 + np.arange(len(f))
        parts.append(f[~(top_records & ~f["positive"])])
    return pd.concat(parts, ignore_index=True)


def unrelated_keep_rate(part: pd.DataFrame, top: float, draws: int = 200) -> float:
    """The share of top records the halves would reproduce if they were unrelated: one half's
    values shuffled across records (``draws`` times, seeded), the outcome recomputed as the two
    halves' mean.  What the filter keeps beyond this share is what the halves agree on."""
    if "cf_half_a" not in part.columns or not part["cf_half_a"].notna().any():
        return math.nan
    a, b = part["cf_half_a"].to_numpy(float), part["cf_half_b"].to_numpy(float)
    rng = np.random.default_rng(17)
    cut = 1 - REPLICATE * top
    rates = []
    for _ in range(draws):
        shuffled = pd.DataFrame({"cf_half_a": a, "cf_half_b": rng.permutation(b)})
        mean = (a + shuffled["cf_half_b"].to_numpy()) / 2
        top_records = mean >= np.quantile(mean, 1 - top)
        kept = ((shuffled["cf_half_a"].rank(pct=True) >= cut) & (shuffled["cf_half_b"].rank(pct=True) >= cut))
        rates.append(float((top_records & kept.to_numpy()).sum() / max(1, top_records.sum())))
    return float(np.mean(rates))


def positives(frames: list[pd.DataFrame], top: float) -> pd.DataFrame:
    """Per seed and scope (all records, base texts): the top records, how many both halves
    reproduce (the positives), how many are left out, and the share the halves would reproduce
    if they were unrelated (``unrelated_keep_rate``)."""
    rows = []
    for f in frames:
        for scope, part in (("all records", f), ("base texts", f[f["kind"] == "base"])):
            top_records = part[CF] >= part[CF].quantile(1 - top)
            kept = top_records & replicated(part, top)
            rows.append({"seed": int(part["seed"].iloc[0]), "scope": scope, "records": len(part),
                         "top records": int(top_records.sum()), "positives (reproduced)": int(kept.sum()),
                         "left out": int((top_records & ~kept).sum()),
                         "share kept": float(kept.sum() / max(1, top_records.sum())),
                         "share kept if the halves were unrelated": unrelated_keep_rate(part, top),
                         "planted among positives": int((kept & (part["kind"] == "planted")).sum())})
    return pd.DataFrame(rows)


def given_rows(frame: pd.DataFrame, cfg: Config, seed: int = 0) -> pd.DataFrame:
    """GNQ (each way it is measured) and K_jj, each given the other and without it: the partial
    rank correlation with counterfactual memorisation given length, loss and log copies, and
    given those plus the other gradient signal."""
    y = frame["positive"].to_numpy(bool)
    groups = cl.groups_of(frame)
    base = [c for c in ("n_tokens", "loss", "log_copies") if frame[c].nunique() > 1]
    rows = []
    for column, label, _ in SIGNALS:
        if column not in ("gnq", "gnq_in_run", "gnq_all", "k_jj") or not frame[column].notna().any():
            continue
        others = (["gnq"] if column == "k_jj" else ["k_jj", "k_jj_in_run"] if column == "gnq_in_run"
                  else ["k_jj"])  # GNQ in run against K_jj post hoc and in run alike
        for given in (base, *[base + [o] for o in others if frame[o].notna().any()]):
            keep = frame[[f"{c}_rank" for c in [column, *given]]].notna().all(axis=1).to_numpy()
            part = partial_rank_correlation(frame[f"{column}_rank"].to_numpy(float)[keep],
                                            frame["cf_rank"].to_numpy(float)[keep],
                                            [frame[f"{c}_rank"].to_numpy(float)[keep] for c in given],
                                            groups=groups[keep], labels=y[keep], resamples=cfg.resamples,
                                            seed=seed)
            rows.append({"signal": label, "given": ", ".join(GIVEN_WORDS[c] for c in given),
                         "records": int(keep.sum()), "partial": part.r, "partial lo": part.lo,
                         "partial hi": part.hi})
    return pd.DataFrame(rows)


def signal_rows(frame: pd.DataFrame, cfg: Config, seed: int = 0) -> pd.DataFrame:
    """Per signal: Spearman with counterfactual memorisation, the partial rank correlation given the
    rule's base (less the signal itself), the top-decile AUC and the CV AUC gain over the base,
    each with its cluster-bootstrap interval; ``positive records`` the independent positives."""
    y = frame["positive"].to_numpy(bool)
    groups = cl.groups_of(frame)
    pos, neg = cl.records(y, groups)
    rows = []
    for column, label, higher in SIGNALS:
        if frame[column].nunique() < 2:  # the loss ratio without a pretrained base; copies among unique texts
            continue
        sign = 1.0 if higher else -1.0
        score = sign * frame[f"{column}_rank"].to_numpy(float)
        # a constant covariate (copies among unique texts) has nothing to hold fixed
        base = [c for c in BASE if c != column and frame[c].nunique() > 1]
        part = partial_rank_correlation(score, frame["cf_rank"].to_numpy(float),
                                        [frame[f"{c}_rank"].to_numpy(float) for c in base],
                                        groups=groups, labels=y, resamples=cfg.resamples, seed=seed)
        row = {"signal": label, "column": column, "records": len(frame), "positive records": pos,
               "spearman": float(pd.Series(score).corr(frame["cf_rank"], method="spearman")),
               "partial": part.r, "partial lo": part.lo, "partial hi": part.hi, "note": ""}
        keep = np.isfinite(score)
        few = cl.too_few(y[keep], groups[keep]) if 0 < y[keep].sum() < keep.sum() else "one outcome only"
        if few:
            row["note"] = few
            rows.append(row)
            continue
        cells, _ = pr.metrics_with_intervals(score[keep], y[keep], groups[keep], cfg.resamples, seed,
                                             fpr_levels=(), fractions=())
        covariates = {"K_jj": frame["k_jj_rank"].to_numpy(float)} if column != "k_jj" else {}
        gain = cv_gain(score, y, frame["n_tokens_rank"].to_numpy(float), frame["loss_rank"].to_numpy(float),
                       resamples=cfg.resamples, seed=seed, groups=groups, min_records=cl.MIN_RECORDS,
                       signal_is_loss=column == "loss",
                       copies=(None if column == "log_copies" or frame["copies"].nunique() < 2
                               else frame["copies"].to_numpy(float)),
                       covariates=covariates)
        row |= {"auc": cells["auc"], "auc lo": cells["auc lo"], "auc hi": cells["auc hi"], "gain": gain.gain,
                "gain lo": gain.lo, "gain hi": gain.hi, "gain base": gain.base, "note": gain.note}
        rows.append(row)
    return pd.DataFrame(rows)


def verdict(gnq: pd.Series, seeds: int, cfg: Config) -> str:
    """The rule (``RULE``) applied to GNQ's row of ``signal_rows``."""
    if seeds < cfg.min_seeds or gnq["positive records"] < cfg.min_records:
        return (f"**Too few** to judge GNQ: {seeds} seed{'s' if seeds > 1 else ''} and "
                f"{gnq['positive records']} independent positive records (the rule needs {cfg.min_seeds} "
                f"and {cfg.min_records}).")
    partial = gnq["partial lo"] > 0
    gain = gnq.get("gain", math.nan) >= cfg.min_gain and gnq.get("gain lo", math.nan) > 0
    if partial or gain:
        why = ("its partial correlation's interval lies above 0" if partial
               else "its CV gain reaches the threshold with its interval above 0")
        return f"**GNQ adds value beyond length, loss, copies and K_jj**: {why}."
    return ("**GNQ does not add value beyond length, loss, copies and K_jj** on this study: neither its "
            "partial correlation's interval lies above 0 nor its CV gain reaches the threshold.")


def variant_rows(frame: pd.DataFrame, cfg: Config, seed: int = 0) -> pd.DataFrame:
    """Each way of measuring GNQ (``GNQ_VARIANTS``) judged by the rule's partial-correlation arm —
    given length, loss, log copies and K_jj — at a level Bonferroni-corrected for the measures
    tried, so that one of them passing by chance stays below the rule's 5%."""
    level = 1 - (1 - pr.LEVEL) / len(GNQ_VARIANTS)
    y = frame["positive"].to_numpy(bool)
    groups = cl.groups_of(frame)
    base = [c for c in BASE if frame[c].nunique() > 1]
    labels = {column: label for column, label, _ in SIGNALS}
    rows = []
    for column in GNQ_VARIANTS:
        if frame[column].nunique() < 2:
            continue
        part = partial_rank_correlation(frame[f"{column}_rank"].to_numpy(float),
                                        frame["cf_rank"].to_numpy(float),
                                        [frame[f"{c}_rank"].to_numpy(float) for c in base], groups=groups,
                                        labels=y, resamples=cfg.resamples, seed=seed, level=level)
        rows.append({"signal": labels[column], "column": column, "level": level, "partial": part.r,
                     "partial lo": part.lo, "partial hi": part.hi, "adds value": bool(part.lo > 0)})
    return pd.DataFrame(rows)


def variant_words(variants: pd.DataFrame) -> str:
    """One sentence: which ways of measuring GNQ add to length, loss, copies and K_jj."""
    if variants.empty:
        return ""
    level = variants["level"].iloc[0]
    cells = "; ".join(f"{r['signal']} {rep.ci(r['partial'], r['partial lo'], r['partial hi'], '.3f')}"
                      for _, r in variants.iterrows())
    passed = variants[variants["adds value"]]["signal"].tolist()
    said = (f"{' and '.join(passed)} add{'s' if len(passed) == 1 else ''} to length, loss, copies and K_jj"
            if passed else "none adds to length, loss, copies and K_jj")
    return (f"Each way GNQ is measured, by the rule's partial-correlation arm at a {level:.1%} level "
            f"(Bonferroni over the {len(variants)} measures tried): {said} — partial ρ {cells}.")


def reliability_rows(frames: list[pd.DataFrame], top: float) -> pd.DataFrame:
    """Per seed, and among base texts only, the outcome's split-half reliability
    (``counterfactual.split_half_reliability``); empty for seeds run without the halves."""
    rows = []
    for f in frames:
        if "cf_half_a" not in f.columns:
            continue
        for scope, part in (("all records", f), ("base texts", f[f["kind"] == "base"])):
            rows.append({"seed": int(f["seed"].iloc[0]), "scope": scope,
                         **split_half_reliability(part["cf_half_a"], part["cf_half_b"], top)})
    return pd.DataFrame(rows)


def mean_by_copies(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Counterfactual memorisation per copy count (planted records) and of the base texts."""
    f = pd.concat(frames, ignore_index=True)
    f["group"] = np.where(f["kind"] == "base", "base texts (1 copy)",
                          "planted × " + f["copies"].astype(str))
    out = f.groupby("group", sort=False)[CF].agg(["count", "mean", "median"])
    out["mean exposure (bits)"] = f.groupby("group", sort=False)[EXPOSURE].mean()
    return out.reset_index().rename(columns={"count": "records"})


# ----------------------------------------------------------------------------------------- cost
BASE_TOKENS, RECORD_TOKENS = 55, 30  # assumed mean tokens of an AG News row (cut at 64) and a planted record


def per_model_seconds(meta: list[dict]) -> float:
    """Measured wall seconds per half-trained model (its fine-tune and its forward pass over every
    record), pooled over the seeds."""
    return (sum(m["seconds"]["half-trained models"] for m in meta)
            / sum(m["config"]["models"] for m in meta))


def measured_rate(meta: list[dict]) -> float:
    """Seconds per trained token measured on this run's half-trained models: their wall time over
    K × (epochs × training tokens of a half + the records' tokens / 3), a forward token counted as
    a third of a trained one; pooled over the seeds (as the CPU / wall share that rescales it)."""
    work = sum(m["config"]["models"] * (m["config"]["epochs"] * m["training_tokens_half"] + m["tokens"] / 3)
               for m in meta)
    return sum(m["seconds"]["half-trained models"] for m in meta) / work


def full_cost(meta: list[dict], measured: Path | None = None) -> dict:
    """The full configuration's estimated time on this machine at K = 8 and 16: per seed, (K/2 + 1)
    trainings' worth of tokens (K models on half the records, one on all) × epochs, plus K + 2
    forward passes over the records (the K models, the full one, the base model) at a third of a
    trained token each, one exact micro-batch audit at about one trained token per token, and the
    exposure's forward passes over every planted value's candidates.  The seconds per trained
    token: this run's own half-trained models where they were SmolLM2 (``measured_rate``), else
    the companions study's SmolLM2 fine-tune (its results.json)."""
    tokens_records = FULL.base_texts * BASE_TOKENS + FULL.records * len(FULL.copies) * RECORD_TOKENS
    tokens_all = FULL.base_texts * BASE_TOKENS + sum(FULL.records * m * RECORD_TOKENS for m in FULL.copies)
    rate, source = math.nan, "no SmolLM2 measurement found"
    measured = measured or Path(__file__).resolve().parents[2] / "reports" / "companions" / "results.json"
    own = bool(meta) and all(m["config"]["model"] == "smollm2" for m in meta)
    if own:
        rate = measured_rate(meta)
        source = (f"this run's {len(meta)} seed(s) of SmolLM2 half-trained models, "
                  f"{per_model_seconds(meta):.0f} s a model")
    elif measured.is_file():
        d = json.loads(measured.read_text(encoding="utf-8"))
        c = d["config"]
        trained = (c["members"] + c["records"] * c["copies"]) * c["max_length"] * c["epochs"]
        fine = [v for k, v in d["stages"].items() if k.endswith("fine-tune")]
        rate = float(np.median(fine)) / trained
        source = (f"reports/companions/results.json: median SmolLM2 fine-tune {np.median(fine):.0f} s for "
                  f"{trained} tokens")

    exposure = FULL.records * len(FULL.copies) * FULL.exposure_candidates * RECORD_TOKENS / 3

    def hours(k: int) -> float:
        per_seed = ((k / 2 + 1) * FULL.epochs * tokens_all + (k + 2) * tokens_records / 3 + tokens_all
                    + exposure)
        return len(FULL.seeds) * per_seed * rate / 3600

    # on a shared machine wall time overstates the work: CPU / wall rescales the estimate to one core
    cpu = sum(m.get("cpu_seconds", math.nan) for m in meta)
    wall = sum(m["seconds_total"] for m in meta)
    share = cpu / wall if own and wall > 0 else math.nan
    return {"tokens_records": tokens_records, "tokens_all": tokens_all, "seconds_per_token_trained": rate,
            "cpu_share": share, "estimated_cpu_hours_k8": hours(8) * share,
            "estimated_cpu_hours_k16": hours(16) * share,
            "rate_source": source, "estimated_hours_k8": hours(8), "estimated_hours_k16": hours(16),
            "formula": ("seeds × ((K/2 + 1) × epochs × T_all + (K + 2) × T_records / 3 + T_all "
                        "+ planted × candidates × T_record / 3) × s_token"),
            "assumptions": (f"T_all, T_records: {BASE_TOKENS} tokens a base text, {RECORD_TOKENS} a planted "
                            "record"),
            "this_run_seconds": wall, "this_run_cpu_seconds": cpu,
            "per_model_seconds": per_model_seconds(meta) if meta else math.nan}


def reductions(cfg: Config) -> list[str]:
    """How this run departs from the study as specified (SmolLM2-135M, FULL's sizes, K ≥ 8, 3
    seeds, exposure): empty for a run of the full specification."""
    out = [] if cfg.model == "smollm2" else [f"model `{cfg.model}` (trained from scratch), not SmolLM2-135M"]
    for name, spec in (("base_texts", "base texts"), ("records", "planted records per copy count"),
                       ("epochs", "epoch(s)"), ("max_length", "tokens kept per text")):
        if getattr(cfg, name) < getattr(FULL, name):
            out.append(f"{getattr(cfg, name)} {spec} instead of {getattr(FULL, name)}")
    if cfg.models < 8:
        out.append(f"K = {cfg.models} half-trained models instead of at least 8")
    if len(cfg.seeds) < cfg.min_seeds:
        out.append(f"{len(cfg.seeds)} seed{'s' if len(cfg.seeds) > 1 else ''} instead of {cfg.min_seeds}")
    if cfg.exposure_candidates < 2:
        out.append("no exposure of the planted values")
    elif cfg.exposure_candidates < FULL.exposure_candidates:
        out.append(f"exposure from {cfg.exposure_candidates} random values, not {FULL.exposure_candidates}")
    return out


# ----------------------------------------------------------------------------------------- report
def finished_seeds(work: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in work.glob("seed-*") if (p / "meta.json").is_file())


def run(ctx: StudyContext, models: int | None = None, records: int | None = None,
        base_texts: int | None = None, seeds: list[int] | None = None, epochs: int | None = None,
        max_length: int | None = None, exposure_candidates: int | None = None, model: str | None = None,
        log=print) -> Path:
    """Build the seeds not finished yet (each resumes), then write the report from all of them."""
    cfg = config(ctx, model=model, models=models, records=records, base_texts=base_texts,
                 seeds=tuple(seeds) if seeds else None, epochs=epochs, max_length=max_length,
                 exposure_candidates=exposure_candidates)
    work = ctx.work_dir(STUDY)
    timings = Timings(work)
    for seed in cfg.seeds:
        run_seed(ctx, cfg, seed, work, timings, log)
    return write_report(ctx, cfg, work, timings)


def _cells(table: pd.DataFrame, key: str, spec: str) -> list[str]:
    """"value [lo, hi]" per row; "too few" where the row has no value."""
    if key not in table:
        return [cl.TOO_FEW] * len(table)
    return [rep.ci(v, lo, hi, spec) if pd.notna(v) else cl.TOO_FEW
            for v, lo, hi in zip(table[key], table[f"{key} lo"], table[f"{key} hi"], strict=True)]


def write_report(ctx: StudyContext, cfg: Config, work: Path, timings: Timings) -> Path:
    done = [s for s in finished_seeds(work) if s in cfg.seeds]
    if not done:
        raise ValueError(f"{work}: no finished seed to report")
    frames = [pd.read_csv(seed_dir(work, s) / "records.csv").assign(seed=s) for s in done]
    meta = [json.loads((seed_dir(work, s) / "meta.json").read_text(encoding="utf-8")) for s in done]
    both = pooled(frames, cfg.top)
    table = signal_rows(both, cfg)
    given = given_rows(both, cfg)
    unique = signal_rows(pooled([f[f["kind"] == "base"] for f in frames], cfg.top), cfg)
    gnq = table.set_index("column").loc[GNQ]
    words = verdict(gnq, len(done), cfg)
    by_copies = mean_by_copies(frames)
    cost = full_cost(meta)
    timings.data = {f"seed {m['seed']}: {k}": v for m in meta for k, v in m["seconds"].items()}
    r = rep.Report(ctx.report_dir(STUDY), "Counterfactual memorisation: the ground truth for every signal")
    r.text(words)
    variants = variant_rows(both, cfg)
    if len(done) >= cfg.min_seeds and gnq["positive records"] >= cfg.min_records:
        r.text(variant_words(variants))
    reduced = reductions(replace(cfg, seeds=tuple(done)))
    if reduced:
        r.text("**A reduced run, not the study as specified**: " + "; ".join(reduced) + ". See Compute for "
               "what the full specification would cost.")
    r.text("## The rule (fixed before the numbers)\n\n" + RULE.format(gain=cfg.min_gain, seeds=cfg.min_seeds,
                                                                       records=cfg.min_records))
    exposure_words = ("Exposure of each planted value over its own space (every digit free), after the same "
                      "prompt: the rank exact by the pruned search where it finishes, else estimated from "
                      f"{cfg.exposure_candidates} random values (`attacks.exposure`, as the audit's secret "
                      "attack)." if cfg.exposure_candidates >= 2
                      else "No exposure (`--exposure-candidates 0`).")
    n_base, n_planted = int((frames[0]["kind"] == "base").sum()), int((frames[0]["kind"] == "planted").sum())
    no_base = " (none: a tiny model's base is random weights)" if cfg.model == "tiny" else ""
    r.text(f"""## Setup

Per seed ({len(done)}: {", ".join(map(str, done))}): {n_base} deduplicated base texts and {n_planted}
planted records ({cfg.records} at each of {", ".join(map(str, cfg.copies))} copies, each holding a
random 4–6-digit value); model `{cfg.model}`. {cfg.models} models from the same initial weights, each
fine-tuned on a random half of the records (copies together; complementary pairs, so each record is
in {cfg.models // 2}); {cfg.epochs} epoch{"s" if cfg.epochs > 1 else ""}, batch {cfg.batch_size}, AdamW
lr {cfg.lr:g}, max {cfg.max_length} tokens. Counterfactual memorisation = mean loss of the models
without the record − mean loss of those with it. Signals from one more model trained on every record, each
averaged over a record's copies, as a user of the tool would have them: GNQ **in run** (each optimizer
step's batch of {cfg.batch_size}, exact, summed over a copy's steps: its GNQ_total; with {cfg.epochs}
epoch{"s" if cfg.epochs > 1 else ""} a copy is in {cfg.epochs} step{"s" if cfg.epochs > 1 else ""}) and K_jj
in run; GNQ **post hoc** at the final weights by the product's audit (`gnq audit`'s code: seeded batches of
{cfg.batch_size}, copies kept apart, exact, λ = {cfg.lam:g}) and its K_jj; GNQ **against the whole set**
(`--companions all`, sketched); the product's **default risk** (no ground truth: calibrated membership or
the loss, or repetition where larger); loss, loss ratio to the base model{no_base}, Min-K%++, zlib ratio,
copies, length. {exposure_words}
Seeds pooled as within-seed ranks. Positives: each seed's top {cfg.top:.0%} of counterfactual memorisation
**that each half of the model pairs alone reproduces** (both halves put it in their top
{REPLICATE * cfg.top:.0%});
a top record the halves do not reproduce is taken for the noise of a few models and left out, neither
positive nor negative (counts below).""")
    shares = {"share kept": ".2f", "share kept if the halves were unrelated": ".2f"}
    r.table(positives(frames, cfg.top), shares,
            caption="Positives per seed: the top records, those both halves reproduce, and those left out. "
                    "The last share is what the filter would keep if the two halves measured unrelated "
                    "things (one half shuffled across records, 200 draws): a kept share near it means the "
                    "positives of that scope are mostly the noise of a few models.")
    reliability = reliability_rows(frames, cfg.top)
    if reliability.empty:
        r.text("Reliability of the outcome: not recorded (these seeds were run before the study kept "
               "each half of the models' counterfactual memorisation; rerun a seed to measure it).")
    else:
        r.table(reliability, {"spearman_halves": ".3f", "spearman_brown": ".3f", "top_agreement": ".2f"},
                caption="Split-half reliability of counterfactual memorisation: each half of the model pairs "
                        "measures it alone; spearman_halves = their rank correlation, spearman_brown = the "
                        "reliability of all the models together, 2ρ/(1+ρ); top_agreement = the share of one "
                        f"half's top {cfg.top:.0%} in the other's (chance {cfg.top:.2f}). An outcome that is "
                        "not reliable cannot validate any signal.")
    per_seed = pd.concat([signal_rows(pooled([f], cfg.top), cfg).assign(seed=int(f["seed"].iloc[0]))
                          for f in frames], ignore_index=True)
    r.table(per_seed.assign(**{"AUC top decile [95%]": _cells(per_seed, "auc", ".3f")})[
        ["seed", "signal", "records", "positive records", "spearman", "AUC top decile [95%]"]],
        caption="Each seed alone (the pooled table below ranks within seeds and pools them).")
    r.table(by_copies, {"mean": ".4f", "median": ".4f", "mean exposure (bits)": ".2f"},
            caption="Counterfactual memorisation (loss out − loss in, nats per token) and the planted "
                    "values' exposure under the fully trained model, by how often a record was repeated.")
    shown = table.assign(**{"partial ρ [95%]": _cells(table, "partial", ".3f"),
                            "AUC top decile [95%]": _cells(table, "auc", ".3f"),
                            "CV gain [95%]": _cells(table, "gain", "+.3f")})
    r.table(shown[["signal", "records", "positive records", "spearman", "partial ρ [95%]",
                   "AUC top decile [95%]", "CV gain [95%]"]],
            caption="Partial ρ: rank correlation with counterfactual memorisation given length, loss, log "
                    "copies and K_jj (less the signal itself). CV gain: out-of-fold AUC for the top decile "
                    "over length spline + loss + log copies + K_jj (less the signal itself). "
                    + pr.interval_method(cfg.resamples, 0, pr.LEVEL))
    r.table(given.assign(**{"partial ρ [95%]": _cells(given, "partial", ".3f")})[
        ["signal", "given", "records", "partial ρ [95%]"]],
        caption="GNQ and K_jj given each other: the partial rank correlation with counterfactual "
                "memorisation given length, loss and log copies, and given those and the other gradient "
                "signal.")
    unique_shown = unique.assign(**{"partial ρ [95%]": _cells(unique, "partial", ".3f"),
                                    "AUC top decile [95%]": _cells(unique, "auc", ".3f")})
    r.table(unique_shown[["signal", "records", "positive records", "spearman", "partial ρ [95%]",
                          "AUC top decile [95%]"]],
            caption="Unique texts only (the base texts, one copy each): positives are each seed's top "
                    f"{cfg.top:.0%} among them that both halves reproduce. Where the outcome is not reliable "
                    "among unique texts (split-half table above), no signal can be validated on them.")
    spent = cost["this_run_cpu_seconds"]
    cpu = f" ({spent:.0f} s of CPU)" if math.isfinite(spent) else ""
    one_core = (f" Scaled by this run's CPU / wall time ({cost['cpu_share']:.2f}) to one core of its own: "
                f"{cost['estimated_cpu_hours_k8']:.0f} and {cost['estimated_cpu_hours_k16']:.0f} CPU hours."
                if math.isfinite(cost["cpu_share"]) else "")
    load = ", ".join(f"{m['load_average']:.1f}" for m in meta if "load_average" in m) or "not recorded"
    r.text(f"""## Compute

This run: {cost['this_run_seconds']:.0f} s of wall time{cpu} on {machine("cpu")}, one torch
thread on a machine shared with other jobs (load average at each seed's end: {load});
a half-trained model (fine-tune and forward pass over every record) took
{cost['per_model_seconds']:.0f} s of wall time on average. The study as specified (SmolLM2-135M,
{FULL.base_texts} base texts, {FULL.records * len(FULL.copies)} planted records, {len(FULL.seeds)} seeds,
{FULL.epochs} epochs, {FULL.max_length} tokens, exposure from {FULL.exposure_candidates} values): estimated
{cost['estimated_hours_k8']:.0f} hours at K = 8 and {cost['estimated_hours_k16']:.0f} at K = 16 on this
machine, by {cost['formula']} with s_token = {cost['seconds_per_token_trained']:.4f} s ({cost['rate_source']};
{cost['assumptions']}).{one_core}""")
    results = {"verdict": words, "rule": RULE.format(gain=cfg.min_gain, seeds=cfg.min_seeds,
                                                      records=cfg.min_records),
               "config": asdict(cfg), "seeds": done, "reduced": reduced, "signals": table,
               "by_copies": by_copies, "reliability": reliability, "per_seed": per_seed,
               "positives": positives(frames, cfg.top), "given": given, "unique_texts": unique,
               "gnq_variants": variants,
               "cost": cost, "command": ctx.command, "seed_meta": meta}
    return r.write(results, command=ctx.command, timings=timings, device=ctx.device)
