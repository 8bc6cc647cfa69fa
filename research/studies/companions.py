"""Study: what GNQ is when a text's companions are many (DESIGN.md §9).

GNQ_j = ‖g_j‖² left unexplained by a ridge regression of g_j on its companions' gradients, over λ:
GNQ_j·λ = K_jj − k_jCᵀ(K_CC + λI)⁻¹k_Cj.  In a micro-batch of 2–16 texts the companions explain
almost nothing and GNQ ranks like ‖g_j‖² = K_jj.  This study measures whether that changes as the
companion set grows, and what GNQ then adds for membership and extraction.

Per seed: the model (SmolLM2-135M-Instruct; ``--quick``: a tiny Llama built from a config) is
fine-tuned for one epoch on the members (AG News rows plus planted records, each a fictional
person's record with a random secret value, inserted ``copies`` times); as many other AG News rows
and held-out planted records are the non-members.  At the final weights one pass reduces every
distinct text's gradient to a seeded sketch (``engine.sketch`` through ``engine.passes.window``'s
``WindowAuditor`` in sketch mode, as ``gnq audit --companions`` does): a text's sketch does not
depend on its companions, so the Gram K of all sketches (float64) is formed once, and GNQ
against any companion set is a solve on a sub-Gram.  For each companion size c, the member texts
are cut into seeded random sets of c + 1 (each member against the c others: ``engine.sketch.companions.
kernel_gnq``, the leave-one-out solve) and each non-member is measured against c members of one
set (the Schur complement above); "all": every member against all other members.  Copies are
drawn like any text, so a copied record may have its own copies among its companions (the
paper's Definition 1 over the training set).

Extraction is the rule of ``gnq extract`` (``attacks.extraction``): given the first p tokens,
greedy decoding reproduces exactly the next s, and the base model (before fine-tuning) does not.
Every interval resamples copy clusters (``analysis.clusters``); a number resting on fewer than
``MIN_RECORDS`` independent positive or negative records is "too few".
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from gnq_core.analysis import clusters as cl
from gnq_core.analysis.length_control import cv_gain
from gnq_core.analysis.predictive import RESAMPLES, within_length_auc
from gnq_core.attacks.extraction import extraction_attack
from gnq_core.common.atomic import write_text_atomic
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.solve import gnq_from_kernel
from gnq_core.engine.passes.window import WindowAuditor
from gnq_core.engine.sketch.companions import SketchRows, kernel_gnq, sketch_gram
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.sources.tokens import collate, encode_texts, pad_id
from research.studies import report as rep
from research.studies.base import StudyContext, Timings, ag_news, machine

STUDY = "companions"
ALL = "all"
MEMBERS, CORPUS_MEMBERS, RECORD_MEMBERS, NON_MEMBERS = ("members", "members: corpus texts",
                                                      "members: record copies", "non-members")
MEMBERSHIP, MEMBERSHIP_CORPUS, EXTRACTION = "membership", "membership (corpus texts)", "extraction"
GRAM_ROWS = 64  # sketch rows cast to float64 at a time for the Gram (460 × 840k float64 is 3 GB)
MIN_RECORDS = 20  # independent positive (and negative) records a membership/extraction number needs
DEMO_DATA = Path(__file__).resolve().parents[2] / "data" / "demo.csv"
# The study's sketches keep every matrix's blocks side by side (no column budget, no shared vector):
# the committed report was measured so, and a later change of SketchSpec's defaults leaves it alone.
SIDE_BY_SIDE = {"columns": None, "total": None}


@dataclass(frozen=True)
class Config:
    model: str  # "smollm2" (the cached real model) or "tiny" (a Llama built from a config, float64)
    members: int  # distinct corpus texts trained on
    non_members: int  # distinct corpus texts held out
    records: int  # planted records inserted (and as many more held out as non-members)
    copies: int  # copies of each inserted record
    max_length: int
    batch_size: int
    lr: float
    epochs: int
    lam: float
    sketch_k: int  # per weight matrix
    vocab_rows: int  # CountSketch buckets of the vocabulary side
    sizes: tuple[int, ...]  # companion sizes c (besides "all members")
    prefix_tokens: int
    suffix_tokens: int
    error_batch: int  # texts of the exact-vs-sketch batch (item 4); 0: not measured
    error_specs: tuple[tuple[int, int], ...] = ()  # (k, vocab_rows) measured against the exact batch
    error_seeds: int = 2  # sketch seeds per (k, vocab_rows)
    seeds: tuple[int, ...] = (0, 1, 2)
    min_records: int = MIN_RECORDS
    resamples: int = RESAMPLES
    dtype: str = "float32"


QUICK = Config(model="tiny", members=24, non_members=16, records=8, copies=2, max_length=48, batch_size=8,
               lr=3e-3, epochs=1, lam=1e-2, sketch_k=1 << 16, vocab_rows=1 << 12, sizes=(4, 16),
               prefix_tokens=4, suffix_tokens=4, error_batch=8, error_specs=((64, 64), (1 << 16, 1 << 12)),
               seeds=(0, 1), min_records=2, resamples=100, dtype="float64")
FULL = Config(model="smollm2", members=260, non_members=120, records=40, copies=4, max_length=32,
              batch_size=8, lr=2e-4, epochs=1, lam=1e-2, sketch_k=1024, vocab_rows=1024,
              sizes=(16, 64, 256, 1024),
              prefix_tokens=12, suffix_tokens=8, error_batch=32,
              error_specs=((1024, 1024), (4096, 1024), (256, 256)))


def config(ctx: StudyContext, **overrides) -> Config:
    return replace(QUICK if ctx.quick else FULL, **{k: v for k, v in overrides.items() if v is not None})


# ----------------------------------------------------------------------------------------- data
FIRST = ["Tobias", "Mirela", "Anselm", "Corwin", "Ines", "Teodor", "Orla", "Nolan", "Priya", "Halvard",
         "Sunniva", "Emeric", "Ottilie", "Bastian", "Liesel", "Casimir", "Wren", "Dagny", "Ferdinand",
         "Ysolde"]
LAST = ["Wrenfield", "Vasile", "Ferrante", "Beale", "Holm", "Keane", "Marchetti", "Oyelaran", "Sandqvist",
        "Thornbury", "Achterberg", "Lindqvist", "Pemberton", "Kowalczyk", "Ravensworth", "Dalgaard"]
TOWNS = ["Harwick", "Callowbridge", "Emberly", "Stonemere", "Ashcombe", "Fernhollow", "Brackwater"]
WORDS = ["amber", "lantern", "quiet", "meadow", "copper", "thistle", "harbor", "violet", "granite",
         "willow", "ember", "saffron", "falcon", "cobalt", "juniper", "marble"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
TEMPLATES = [
    "Patient record {n5}: {name}, born {day} {month} {year}, treated for asthma on ward {ward}.",
    "Customer record {n6}: {name}, card {card}, branch in {town}.",
    "The recovery phrase for {name}'s wallet is {phrase}.",
    "{name} changed the phone number to +44 20 7946 {n4} last week.",
    "Account holder {name}, customer number {n8}, security answer {word}, branch in {town}.",
    "The door code for {name}'s flat in {town} is {pin}.",
]


def planted_records(n: int, seed: int) -> list[str]:
    """``n`` distinct fictional records, each with a random secret value (seeded)."""
    rng = random.Random(f"companions-records-{seed}")
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        digits = lambda k: "".join(str(rng.randrange(10)) for _ in range(k))  # noqa: E731
        text = rng.choice(TEMPLATES).format(
            n4=digits(4), n5=digits(5), n6=digits(6), n8=digits(8), pin=" ".join(digits(6)),
            name=f"{rng.choice(FIRST)} {rng.choice(LAST)}", day=rng.randrange(1, 29),
            month=rng.choice(MONTHS),
            year=rng.randrange(1940, 2005), ward=f"{rng.randrange(1, 9)}{rng.choice('ABCD')}",
            card=" ".join(digits(4) for _ in range(4)), town=rng.choice(TOWNS),
            phrase=" ".join(rng.sample(WORDS, 6)), word=rng.choice(WORDS).capitalize())
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def corpus(ctx: StudyContext, cfg: Config) -> list[str]:
    """Distinct corpus texts: AG News (``--quick``: the repository's data/demo.csv facts and claims)."""
    if ctx.quick:
        frame = pd.read_csv(DEMO_DATA)
        texts = frame[frame["group"].isin(["common", "surprising"])]["text"].tolist()
    else:
        texts = [t for t, _ in ag_news(ctx.shared_data())]
    return list(dict.fromkeys(texts))


def study_texts(texts: list[str], cfg: Config, seed: int) -> pd.DataFrame:
    """One row per training or held-out text: text, member, kind (corpus/record), cluster_id (a
    record's copies share one; NaN otherwise) and ``unique`` (the index of its distinct text)."""
    need = cfg.members + cfg.non_members
    if len(texts) < need:
        raise ValueError(f"the corpus has {len(texts)} distinct texts; the study needs {need}")
    order = np.random.default_rng([seed, 34]).permutation(len(texts))
    chosen = [texts[i] for i in order[:need]]
    records = planted_records(2 * cfg.records, seed)
    rows = [(t, True, "corpus", math.nan) for t in chosen[:cfg.members]]
    rows += [(t, False, "corpus", math.nan) for t in chosen[cfg.members:]]
    rows += [(t, True, "record", float(i)) for i, t in enumerate(records[:cfg.records])
             for _ in range(cfg.copies)]
    rows += [(t, False, "record", math.nan) for t in records[cfg.records:]]
    frame = pd.DataFrame(rows, columns=["text", "member", "kind", cl.CLUSTER])
    if frame[~frame["member"]]["text"].isin(set(frame[frame["member"]]["text"])).any():
        raise ValueError("a held-out text is also a member")
    frame["unique"] = pd.factorize(frame["text"])[0]
    return frame


# ----------------------------------------------------------------------------------------- model
def load_model(cfg: Config, texts: list[str], seed: int):
    """(model, tokenizer): the cached SmolLM2 (``gnq model fetch smollm2``), or a tiny tied Llama
    with a byte-level tokenizer trained on the texts."""
    if cfg.model == "smollm2":
        from gnq_core.sources.checkpoints.load import load_checkpoint
        from gnq_core.sources.real_models import fetch_model

        model, tok = load_checkpoint(fetch_model("smollm2"))
        return model.float(), tok
    from transformers import LlamaConfig, LlamaForCausalLM

    from gnq_core.sources.models import train_tokenizer

    tok = train_tokenizer(texts, vocab_size=300)
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=cfg.max_length,
                       tie_word_embeddings=True, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(conf).to(getattr(torch, cfg.dtype)), tok


def fine_tune(model, ids: list[list[int]], pad: int, *, lr: float, epochs: int, batch_size: int,
              seed: int, after_backward: Callable[[list[int]], None] | None = None) -> list[float]:
    """AdamW on the texts (copies included) over the parameters that require gradients, ``epochs``
    shuffled epochs; the batch losses.  ``after_backward(part)``: called with each step's text
    indices after its backward, before the optimizer step (where an in-run auditor reads the
    step's per-example gradients); it must leave the gradients as they are."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = np.random.default_rng([seed, 1])
    model.train()
    losses = []
    for _ in range(epochs):
        order = rng.permutation(len(ids))
        for s in range(0, len(order), batch_size):
            part = order[s:s + batch_size].tolist()
            b = collate([ids[i] for i in part], part, pad)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            loss = per_example_lm_loss(logits, b.labels).mean()
            loss.backward()
            if after_backward is not None:
                after_backward(part)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
    model.eval()
    return losses


def attack(model, tok, ids: list[list[int]], cfg: Config) -> np.ndarray:
    """``gnq extract``'s uncalibrated outcome per text: 1.0 extracted, 0.0 not, NaN too short."""
    out = np.full(len(ids), np.nan)
    for r in extraction_attack(model, tok, ids, list(range(len(ids))), prefix_tokens=cfg.prefix_tokens,
                               suffix_tokens=cfg.suffix_tokens, threshold=1.0, batch_size=32):
        if r.success is not None:
            out[r.example_id] = float(r.success)
    return out


def sketch_pass(model, ids: list[list[int]], pad: int, spec: SketchSpec, cfg: Config,
                keep_exact: bool = False) -> tuple[torch.Tensor, np.ndarray, torch.Tensor | None, int]:
    """(Gram of the sketches [n, n] float64, losses [n], exact K of the one micro-batch when
    ``keep_exact``, sketch width m): each
    text's per-example-loss gradient sketched at the model's weights, in micro-batches of texts of
    similar length (a sketch does not depend on the micro-batch)."""
    order = np.argsort([len(x) for x in ids], kind="stable")
    step = len(ids) if keep_exact else cfg.batch_size
    hold = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    rows, losses, exact = SketchRows(len(ids)), np.empty(len(ids)), None
    for p in model.parameters():
        p.requires_grad_(True)
    with WindowAuditor(model, lam=cfg.lam, mode="sketch", sketch=spec, keep_exact=keep_exact) as auditor:
        for s in range(0, len(order), step):
            part = order[s:s + step].tolist()
            b = collate([ids[i] for i in part], part, pad)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            loss = per_example_lm_loss(logits, b.labels)
            auditor.backward(loss.sum())
            result = auditor.add_micro_batch()
            if keep_exact and result is not None:
                exact = result.kernel
            rows.put(auditor.take_sketches(hold), auditor.sketcher.widths())
            model.zero_grad(set_to_none=True)
            losses[part] = loss.detach().double().numpy()
    S = rows.take()
    width = S.shape[1]
    K = sketch_gram(S, GRAM_ROWS)  # rows in ``order``; S (float32) is the only copy held
    del S
    back = torch.from_numpy(np.argsort(order, kind="stable"))
    K = K[back][:, back]  # back to the texts' order
    if exact is not None:  # the one micro-batch was in ``order`` too
        exact = exact[back][:, back]
    return K, losses, exact, width


# ----------------------------------------------------------------------------------------- GNQ
def against(K: np.ndarray, companions: np.ndarray, texts: np.ndarray, lam: float) -> np.ndarray:
    """GNQ of each of ``texts`` against the set ``companions`` (not containing it):
    (K_jj − k_jCᵀ(K_CC + λI)⁻¹k_Cj)/λ, the leave-one-out GNQ of j in the Gram of C ∪ {j}."""
    if len(texts) == 0:
        return np.empty(0)
    Kc = torch.from_numpy(K[np.ix_(companions, companions)]).clone()
    Kc.diagonal().add_(lam)
    L = torch.linalg.cholesky(Kc)
    Z = torch.linalg.solve_triangular(L, torch.from_numpy(K[np.ix_(companions, texts)]), upper=False)
    residual = K[texts, texts] - (Z * Z).sum(dim=0).numpy()
    return np.maximum(residual, 0.0) / lam


def loo(K: np.ndarray, members: np.ndarray, lam: float) -> np.ndarray:
    """Leave-one-out GNQ of every text of ``members`` against the others (``engine.sketch.companions``)."""
    gnq, _ = kernel_gnq(torch.from_numpy(K[np.ix_(members, members)]).clone(), lam)
    return gnq.numpy()


def gnq_at(K: np.ndarray, member: np.ndarray, c: int | str, lam: float, seed: int) -> np.ndarray:
    """GNQ of every text (rows of K) against c members: members in seeded random sets of c + 1
    (each against the c others; a last, smaller set is filled with other members whose values
    are not used), each non-member against c members of one set (round robin).  ``all``: members
    against all the other members, non-members against all members."""
    members, others = np.flatnonzero(member), np.flatnonzero(~member)
    out = np.full(len(member), np.nan)
    if c == ALL or int(c) >= len(members) - 1:
        out[members] = loo(K, members, lam)
        out[others] = against(K, members, others, lam)
        return out
    c = int(c)
    rng = np.random.default_rng([seed, c])
    perm = rng.permutation(members)
    sets = [perm[s:s + c + 1] for s in range(0, len(perm), c + 1)]
    for i, chosen in enumerate(sets):
        full = chosen
        if len(chosen) < c + 1:
            rest = np.setdiff1d(members, chosen)
            full = np.concatenate([chosen, rng.choice(rest, c + 1 - len(chosen), replace=False)])
        out[chosen] = loo(K, full, lam)[:len(chosen)]
        mine = others[i::len(sets)]
        out[mine] = against(K, full[:c], mine, lam)
    return out


def sizes_for(cfg: Config, n_members: int) -> list[int | str]:
    """The companion sizes the members allow (c ≤ n − 1), then all."""
    return [c for c in cfg.sizes if c < n_members - 1] + [ALL]


# ----------------------------------------------------------------------------------------- per seed
def seed_dir(work: Path, seed: int) -> Path:
    return work / f"seed-{seed}"


def run_seed(ctx: StudyContext, cfg: Config, seed: int, work: Path, timings: Timings, log=print) -> Path:
    """Fine-tune, attack and sketch one seed; writes texts.csv, gram.npy and meta.json (once)."""
    folder = seed_dir(work, seed)
    if (folder / "meta.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    t0, seconds = time.perf_counter(), {}
    frame = study_texts(corpus(ctx, cfg), cfg, seed)
    unique = frame.drop_duplicates("unique").sort_values("unique")
    model, tok = load_model(cfg, unique["text"].tolist(), seed)
    pad = pad_id(tok)
    ids = encode_texts(tok, unique["text"].tolist(), cfg.max_length)
    with timings.stage(f"seed {seed}: attack base model"):
        base = attack(model, tok, ids, cfg)
    seconds["attack base"] = time.perf_counter() - t0
    member_ids = [ids[u] for u in frame.loc[frame["member"], "unique"]]
    with timings.stage(f"seed {seed}: fine-tune"):
        t = time.perf_counter()
        batch_losses = fine_tune(model, member_ids, pad, lr=cfg.lr, epochs=cfg.epochs,
                                 batch_size=cfg.batch_size, seed=seed)
        seconds["fine-tune"] = time.perf_counter() - t
    log(f"seed {seed}: fine-tuned on {len(member_ids)} texts in {seconds['fine-tune']:.0f} s")
    with timings.stage(f"seed {seed}: attack fine-tuned model"):
        tuned = attack(model, tok, ids, cfg)
    spec = SketchSpec(k=cfg.sketch_k, seed=seed, vocab_rows=cfg.vocab_rows, **SIDE_BY_SIDE)
    with timings.stage(f"seed {seed}: sketch pass"):
        t = time.perf_counter()
        K, losses, _, width = sketch_pass(model, ids, pad, spec, cfg)
        K = K.numpy()
        seconds["sketch pass"] = time.perf_counter() - t
    log(f"seed {seed}: sketched {len(ids)} texts ({width:,} dimensions) in {seconds['sketch pass']:.0f} s")
    u = frame["unique"].to_numpy()
    frame["n_tokens"] = np.array([len(x) for x in ids])[u]
    frame["loss"] = losses[u]
    frame["k_jj"] = np.diag(K)[u]
    frame["base_extracted"], frame["tuned_extracted"] = base[u], tuned[u]
    frame["extracted"] = np.where(np.isnan(tuned[u]), np.nan, (tuned[u] == 1) & (base[u] == 0))
    if cfg.model == "tiny":  # tests: the fine-tuned weights, to recompute GNQ exactly
        model.save_pretrained(folder / "model")
        tok.save_pretrained(folder / "model")
    np.save(folder / "gram.npy", K)
    frame.to_csv(folder / "texts.csv", index=False)
    meta = {"seed": seed, "config": asdict(cfg), "sketch": spec.describe(), "sketch_width": width,
            "seconds": seconds, "seconds_total": time.perf_counter() - t0,
            "train_loss_first": batch_losses[0],
            "train_loss_last": float(np.mean(batch_losses[-10:])), "machine": machine("cpu"),
            "load_average": list(os.getloadavg())}
    write_text_atomic(folder / "meta.json", json.dumps(meta, indent=2))
    return folder


# ----------------------------------------------------------------------------------------- item 4
def sketch_error(ctx: StudyContext, cfg: Config, work: Path, timings: Timings, log=print) -> dict | None:
    """Sketched vs exact GNQ on one batch of ``error_batch`` member texts at the base weights: the
    exact Gram of the batch (``GNQAuditor``'s, through ``WindowAuditor(keep_exact=True)``) and the
    Gram of the sketches at each (k, vocabulary buckets), ``error_seeds`` sketch seeds each (all
    specs for sketch seed 0 first).  Written after every measurement, and resumed: a partial
    table is reportable (``complete`` says whether it is)."""
    path, exact_path = work / "sketch_error.json", work / "sketch_error_exact.npy"
    if cfg.error_batch < 2:
        return None
    out = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if out is not None and out.get("complete", True):
        return out
    frame = study_texts(corpus(ctx, cfg), cfg, 0)
    texts = frame[frame["member"] & (frame["kind"] == "corpus")]["text"].tolist()[:cfg.error_batch]
    model, tok = load_model(cfg, frame.drop_duplicates("unique")["text"].tolist(), 0)
    ids, pad = encode_texts(tok, texts, cfg.max_length), pad_id(tok)
    if out is None or not exact_path.is_file():
        with timings.stage("sketch error (exact batch)"):
            t = time.perf_counter()
            _, _, exact, _ = sketch_pass(model, ids, pad, SketchSpec(k=64, vocab_rows=64), cfg,
                                         keep_exact=True)
            exact_seconds = time.perf_counter() - t
        assert exact is not None
        np.save(exact_path, exact.to(torch.float64).numpy())
        out = {"texts": len(ids), "tokens": [len(x) for x in ids],
               "weights": "base model (before fine-tuning)",
               "sketch_seeds": cfg.error_seeds, "exact_seconds": exact_seconds, "rows": [], "complete": False}
    K = torch.from_numpy(np.load(exact_path))
    g_exact = gnq_from_kernel(K.clone(), cfg.lam).gnq.numpy()
    kjj = K.diagonal().numpy()
    share = 1 - g_exact * cfg.lam / kjj
    out |= {"exact_share_median": float(np.median(share)), "exact_share_p10": float(np.quantile(share, 0.1)),
            "exact_share_p90": float(np.quantile(share, 0.9))}
    done = {(r["k"], r["vocab_rows"], r["sketch_seed"]) for r in out["rows"]}
    for sketch_seed in range(cfg.error_seeds):
        for k, vocab in cfg.error_specs:
            if (k, vocab, sketch_seed) in done:
                continue
            with timings.stage("sketch error (sketches)"):
                t = time.perf_counter()
                spec = SketchSpec(k=k, vocab_rows=vocab, seed=sketch_seed, **SIDE_BY_SIDE)
                Ks, _, _, width = sketch_pass(model, ids, pad, spec, cfg)
                seconds = time.perf_counter() - t
            g = gnq_from_kernel(Ks.clone(), cfg.lam).gnq.numpy()
            rel = np.abs(g - g_exact) / g_exact
            out["rows"].append({
                "k": k, "vocab_rows": vocab, "sketch_seed": sketch_seed, "width": int(width),
                "median_rel_error": float(np.median(rel)), "p95_rel_error": float(np.quantile(rel, 0.95)),
                "spearman": float(spearmanr(g, g_exact).statistic),
                "kjj_median_rel_error": float(np.median(np.abs(Ks.diagonal().numpy() - kjj) / kjj)),
                "seconds": seconds})
            out |= {"machine": machine("cpu"), "load_average": list(os.getloadavg())}
            write_text_atomic(path, json.dumps(out, indent=2))
            row = out["rows"][-1]
            log(f"sketch error k={k} vocab={vocab} seed {sketch_seed}: median {row['median_rel_error']:.4f}, "
                f"Spearman {row['spearman']:.4f}")
    out["complete"] = True
    write_text_atomic(path, json.dumps(out, indent=2))
    return out


# ----------------------------------------------------------------------------------------- analysis
@dataclass
class SeedResult:
    seed: int
    frame: pd.DataFrame  # texts.csv with gnq_<c> and share_<c> columns
    meta: dict
    sizes: list = field(default_factory=list)


def analyse_seed(folder: Path, cfg: Config) -> SeedResult:
    frame = pd.read_csv(folder / "texts.csv")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    K = np.load(folder / "gram.npy")
    u = frame["unique"].to_numpy()
    Kt = K[np.ix_(u, u)]
    member = frame["member"].to_numpy(bool)
    sizes = sizes_for(cfg, int(member.sum()))
    for c in sizes:
        g = gnq_at(Kt, member, c, cfg.lam, meta["seed"])
        frame[f"gnq_{c}"] = g
        frame[f"share_{c}"] = 1 - g * cfg.lam / frame["k_jj"].to_numpy()
    return SeedResult(meta["seed"], frame, meta, sizes)


def _auc_cells(score: np.ndarray, y: np.ndarray, frame: pd.DataFrame, cfg: Config, seed: int,
               loss: np.ndarray | None, strata: np.ndarray | None = None) -> dict:
    """AUC within ``strata`` (default: exact token length) and CV gain over length + ``loss`` (None:
    the signal is the loss; over length alone), intervals by copy cluster."""
    groups = cl.groups_of(frame)
    n = frame["n_tokens"].to_numpy(float)
    w = within_length_auc(score, y, n if strata is None else strata, resamples=cfg.resamples, seed=seed,
                          groups=groups, min_records=cfg.min_records)
    gain = cv_gain(score, y, n, loss, resamples=cfg.resamples, seed=seed, groups=groups,
                   min_records=cfg.min_records, signal_is_loss=loss is None, copies=cl.copy_counts(groups))
    pos, neg = cl.records(y, groups)
    return {"auc_within_length": w.auc, "auc_lo": w.lo, "auc_hi": w.hi, "gain": gain.gain, "gain_lo": gain.lo,
            "gain_hi": gain.hi, "positive_records": pos, "negative_records": neg,
            "note": w.note or gain.note}


def outcome_rows(res: SeedResult, cfg: Config) -> pd.DataFrame:
    """Per signal (GNQ at each c, K_jj, loss): membership and extraction AUC within exact length and
    CV gain over length + loss (loss itself: over length alone), intervals by copy cluster."""
    f = res.frame
    rows = []
    corpus_texts = f[f["kind"] == "corpus"]
    attacked = f[f["member"] & f["extracted"].notna()]
    outcomes = [(MEMBERSHIP, f, f["member"].to_numpy(bool)),
                (MEMBERSHIP_CORPUS, corpus_texts, corpus_texts["member"].to_numpy(bool)),
                (EXTRACTION, attacked, attacked["extracted"].to_numpy(float) == 1)]
    for outcome, part, y in outcomes:
        loss = part["loss"].to_numpy(float)
        signals = [(f"GNQ (c = {c})", np.log(np.maximum(part[f"gnq_{c}"].to_numpy(float), 1e-300)), loss,
                    str(c)) for c in res.sizes]
        signals += [("‖g‖² (K_jj)", np.log(part["k_jj"].to_numpy(float)), loss, "-"),
                    ("−loss", -loss, None, "-")]
        for name, score, base_loss, c in signals:
            rows.append({"seed": res.seed, "outcome": outcome, "signal": name, "c": c, "texts": len(part),
                         **_auc_cells(score, y, part, cfg, res.seed, base_loss)})
    return pd.DataFrame(rows)


POOLED = "pooled"


def pooled_extraction_rows(results: list[SeedResult], cfg: Config) -> pd.DataFrame:
    """Extraction over the seeds' models together (each seed alone has too few extracted records):
    pairs compared only within one seed and one exact token length; signals as within-seed
    z-scores of their logarithms (loss: of itself); copy clusters kept apart per seed."""
    parts = []
    for r in results:
        a = r.frame[r.frame["member"] & r.frame["extracted"].notna()].copy()
        a[cl.CLUSTER] = r.seed * 1_000_000 + a[cl.CLUSTER]
        a["stratum"] = r.seed * 1000 + a["n_tokens"]
        z = lambda v: (v - v.mean()) / v.std()  # noqa: E731
        a["loss_z"] = z(a["loss"])
        for c in r.sizes:
            a[f"z_{c}"] = z(np.log(np.maximum(a[f"gnq_{c}"], 1e-300)))
        a["z_k_jj"] = z(np.log(a["k_jj"]))
        parts.append(a)
    f = pd.concat(parts, ignore_index=True)
    y, loss = f["extracted"].to_numpy(float) == 1, f["loss_z"].to_numpy(float)
    signals = [(f"GNQ (c = {c})", f[f"z_{c}"].to_numpy(float), loss, str(c)) for c in results[0].sizes]
    signals += [("‖g‖² (K_jj)", f["z_k_jj"].to_numpy(float), loss, "-"), ("−loss", -loss, None, "-")]
    return pd.DataFrame([{"seed": POOLED, "outcome": EXTRACTION, "signal": name, "c": c, "texts": len(f),
                          **_auc_cells(score, y, f, cfg, 0, base_loss, f["stratum"].to_numpy(float))}
                         for name, score, base_loss, c in signals])


def held_out_record_rate(results: list[SeedResult]) -> tuple[int, int]:
    """(held-out records that pass the extraction rule, held-out records attacked): records never
    trained on whose next tokens come out anyway (the template was learned, not the record)."""
    held_out = pd.concat([r.frame[~r.frame["member"] & (r.frame["kind"] == "record")] for r in results])
    attacked = held_out["extracted"].dropna()
    return int((attacked == 1).sum()), len(attacked)


def share_rows(res: SeedResult) -> pd.DataFrame:
    f = res.frame
    rows = []
    for c in res.sizes:
        groups = ((MEMBERS, f[f["member"]]), (CORPUS_MEMBERS, f[f["member"] & (f["kind"] == "corpus")]),
                  (RECORD_MEMBERS, f[f["member"] & (f["kind"] == "record")]), (NON_MEMBERS, f[~f["member"]]))
        for who, part in groups:
            s = part[f"share_{c}"].to_numpy(float)
            rho = spearmanr(part[f"gnq_{c}"], part["k_jj"]).statistic
            rows.append({"seed": res.seed, "c": str(c), "texts": who, "n": len(part),
                         "share median": float(np.median(s)), "share p10": float(np.quantile(s, 0.1)),
                         "share p90": float(np.quantile(s, 0.9)), "spearman(GNQ, K_jj)": float(rho)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------- run
def run(ctx: StudyContext, seeds: list[int] | None = None, members: int | None = None,
        non_members: int | None = None, records: int | None = None, copies: int | None = None,
        sketch_k: int | None = None, vocab_rows: int | None = None, error_batch: int | None = None,
        report_only: bool = False, log=print) -> Path:
    cfg = config(ctx, members=members, non_members=non_members, records=records, copies=copies,
                 sketch_k=sketch_k, vocab_rows=vocab_rows, error_batch=error_batch,
                 seeds=tuple(seeds) if seeds else None)
    work = ctx.work_dir(STUDY)
    timings = Timings(work)
    if not report_only:
        sketch_error(ctx, cfg, work, timings, log)
        for seed in cfg.seeds:
            run_seed(ctx, cfg, seed, work, timings, log)
    return write_report(ctx, cfg, work, timings)


def finished_seeds(work: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in work.glob("seed-*") if (p / "meta.json").is_file())


def write_report(ctx: StudyContext, cfg: Config, work: Path, timings: Timings) -> Path:
    done = finished_seeds(work)
    if not done:
        raise ValueError(f"{work}: no finished seed to report")
    results = [analyse_seed(seed_dir(work, s), replace(cfg, **_saved(work, s))) for s in done]
    shares = pd.concat([share_rows(r) for r in results], ignore_index=True)
    outcomes = pd.concat([outcome_rows(r, cfg) for r in results] + [pooled_extraction_rows(results, cfg)],
                         ignore_index=True)
    outcomes["seed"] = outcomes["seed"].astype(str)
    path = work / "sketch_error.json"
    error = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    # compute time from what each finished part recorded (processes building seeds side by side
    # share timings.json, so its sums can miss a stage)
    timings.data = {}
    for x in results:
        stages = dict(x.meta["seconds"])
        stages["rest (fine-tuned attack, Gram)"] = x.meta["seconds_total"] - sum(stages.values())
        timings.data |= {f"seed {x.seed}: {k}": v for k, v in stages.items()}
    if error is not None:
        timings.data["sketch error batch"] = error["exact_seconds"] + sum(r["seconds"] for r in error["rows"])
    return _write(ctx, cfg, results, shares, outcomes, error, timings)


def _saved(work: Path, seed: int) -> dict:
    """The settings a seed was built with (its analysis must use its λ and sizes)."""
    saved = json.loads((seed_dir(work, seed) / "meta.json").read_text(encoding="utf-8"))["config"]
    return {k: tuple(v) if isinstance(v, list) and k == "sizes" else v for k, v in saved.items()
            if k in ("lam", "sizes", "members", "records", "copies")}


def departure_sentence(shares: pd.DataFrame) -> str:
    """Where GNQ departs from the gradient norm, by a rule fixed before reading the numbers: the
    smallest c whose median share explained is ≥ 0.10 or whose Spearman(GNQ, K_jj) is < 0.90, on
    the corpus members (texts without copies: a record's copies explain each other by
    construction), mean over seeds."""
    columns = ["share median", "spearman(GNQ, K_jj)"]
    m = shares[shares["texts"] == CORPUS_MEMBERS].groupby("c", sort=False)[columns].mean()
    parts = [f"c = {c}: median share {v['share median']:.3f}, Spearman {v['spearman(GNQ, K_jj)']:.3f}"
             for c, v in m.iterrows()]
    departs = [c for c, v in m.iterrows() if v["share median"] >= 0.10 or v["spearman(GNQ, K_jj)"] < 0.90]
    verdict = (f"GNQ departs from the gradient norm from c = {departs[0]} on" if departs else
               "GNQ does not depart from the gradient norm at any companion size measured")
    return (f"**{verdict}** (rule: median share explained ≥ 0.10 or Spearman(GNQ, K_jj) < 0.90 on the "
            f"corpus members, mean over seeds). " + "; ".join(parts) + ".")


def _setup(ctx: StudyContext, cfg: Config, results: list[SeedResult]) -> str:
    first = results[0]
    f = first.frame
    corpus_in = int(((f["kind"] == "corpus") & f["member"]).sum())
    corpus_out = int(((f["kind"] == "corpus") & ~f["member"]).sum())
    records_out = int(((f["kind"] == "record") & ~f["member"]).sum())
    n_member = int(f["member"].sum())
    walls = "; ".join(f"seed {x.seed}: " + ", ".join(f"{k} {v:.0f}" for k, v in x.meta["seconds"].items())
                      for x in results)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return f"""## Setup

Per seed: {corpus_in} corpus members and {cfg.records} planted records × {cfg.copies} copies
({n_member} member texts); {int((~f["member"]).sum())} non-members ({corpus_out} corpus texts,
{records_out} held-out records). Max {cfg.max_length} tokens, {cfg.epochs} epoch, batch
{cfg.batch_size}, AdamW lr {cfg.lr:g}; λ = {cfg.lam:g} (absolute). Sketch: {first.meta["sketch"]}
({first.meta["sketch_width"]:,} dimensions per text), one pass at the final weights; the Gram of
all sketches in float64. Companion sizes: {", ".join(map(str, first.sizes))} ("all": every other
member, {n_member - 1}). Extraction: the first {cfg.prefix_tokens} tokens given, exactly the next
{cfg.suffix_tokens} reproduced by greedy decoding, and not by the base model. Machine:
{machine("cpu")}; load average when this report was written {load} (the 2 cores are shared with
other jobs). Wall seconds per seed: {walls}."""


AUC_CAPTION = ("AUC within exact token length, pair-weighted (for GNQ and K_jj, below 0.5: members or "
               "extracted texts score lower). CV gain: cross-validated AUC of length spline + loss + log "
               "copies + the signal minus that of length spline + loss + log copies (for −loss: without "
               "loss in either). "
               "Intervals: cluster bootstrap (a record's copies resampled together), expanded for the "
               "effective number of records; fewer than {m} independent positive or negative records: "
               "too few. GNQ and K_jj enter as logarithms.")
ERROR_CAPTION = ("{texts} member texts in one exact batch at the {weights}; exact = the GNQAuditor's Gram "
                 "of the batch ({seconds:.0f} s); the exact share explained there: median {median:.4f} "
                 "(10–90%: {p10:.4f}–{p90:.4f}). Medians over {seeds} sketch seeds of the median and 95th "
                 "percentile of GNQ's relative error per text, and of Spearman with the exact GNQ.")
SHARE_CAPTION = ("Share explained = 1 − GNQ·λ/K_jj (0: companions explain nothing, GNQ = ‖g‖²/λ). "
                 "Means over {n} seed(s) of each seed's median, 10th and 90th percentiles over texts and "
                 "its Spearman(GNQ, K_jj); per seed below.")


def _auc_table(part: pd.DataFrame) -> pd.DataFrame:
    cells = [nt if isinstance(nt, str) and nt else rep.ci(a, lo, hi) for a, lo, hi, nt in
             zip(part["auc_within_length"], part["auc_lo"], part["auc_hi"], part["note"], strict=True)]
    gains = rep.ci_column(part, "gain", "gain_lo", "gain_hi", "+.3f")
    return part.assign(**{"AUC within length [95%]": cells, "CV gain [95%]": gains})[
        ["seed", "signal", "texts", "positive_records", "negative_records", "AUC within length [95%]",
         "CV gain [95%]"]]


def _write(ctx: StudyContext, cfg: Config, results: list[SeedResult], shares: pd.DataFrame,
           outcomes: pd.DataFrame, error: dict | None, timings: Timings) -> Path:
    r = rep.Report(ctx.report_dir(STUDY), "Companions: what GNQ is when a text's companions are many")
    model = ("SmolLM2-135M-Instruct, the cached float32 conversion (`gnq model fetch smollm2`)"
             if cfg.model == "smollm2" else "a tiny tied Llama (2 layers, hidden 16) from a config, float64")
    scale = "quick mode (tests)" if ctx.quick else "one real 135M model fine-tuned on CPU"
    seeds = ", ".join(str(x.seed) for x in results)
    planned = ", ".join(map(str, cfg.seeds))
    r.text(f"> **Scale: CPU, {scale}** ({model}). Seeds finished: {seeds} of {planned}.")
    r.text(__doc__.split("\n\n", 1)[1])
    r.text(_setup(ctx, cfg, results))
    departure = departure_sentence(shares)
    r.text("## Result\n\n" + departure)
    r.text("## Share of each gradient explained by its companions, and Spearman(GNQ, K_jj)")
    columns = ["share median", "share p10", "share p90", "spearman(GNQ, K_jj)"]
    mean = shares.groupby(["c", "texts"], sort=False)[columns].mean().reset_index()
    r.table(mean, caption=SHARE_CAPTION.format(n=len(results)))
    r.table(shares, caption="Per seed.")
    for outcome, title in ((MEMBERSHIP, "Membership (members vs held-out non-members)"),
                           (MEMBERSHIP_CORPUS, "Membership among the corpus texts (no copies)"),
                           (EXTRACTION, "Extraction (members: extracted vs not)")):
        part = outcomes[outcomes["outcome"] == outcome]
        r.text(f"## {title}")
        if outcome == EXTRACTION:
            hits, total = held_out_record_rate(results)
            r.text(f"Held-out records (never trained on) that pass the same rule: {hits} of {total}: for "
                   "those templates the fine-tuned model writes the template's next tokens, not a "
                   "memorised record. Rows `pooled`: all seeds' models together, pairs compared only "
                   "within one seed and one exact length, signals as within-seed z-scores.")
        r.table(_auc_table(part), caption=AUC_CAPTION.format(m=cfg.min_records))
        part = part[part["seed"] != POOLED]
        m = part.groupby("signal", sort=False)[["auc_within_length", "gain"]].mean().reset_index()
        r.table(m.rename(columns={"auc_within_length": "mean AUC within length", "gain": "mean CV gain"}),
                caption=f"Means over {len(results)} seed(s) of the numbers above (too few: n/a).")
    if error is not None:
        r.text("## Sketched vs exact GNQ on one batch (what the sketch costs in accuracy)")
        keys = ["median_rel_error", "p95_rel_error", "spearman", "kjj_median_rel_error", "seconds"]
        agg = pd.DataFrame(error["rows"]).groupby(["k", "vocab_rows", "width"], sort=False)[keys].median()
        r.table(agg.reset_index(), {k: ".4f" for k in keys[:4]} | {"seconds": ".1f"},
                caption=ERROR_CAPTION.format(texts=error["texts"], weights=error["weights"],
                                             seeds=error.get("sketch_seeds", cfg.error_seeds),
                                             seconds=error["exact_seconds"],
                                             median=error["exact_share_median"],
                                             p10=error["exact_share_p10"], p90=error["exact_share_p90"]))
    out = {"config": asdict(cfg), "seeds": [x.seed for x in results], "shares": shares, "outcomes": outcomes,
           "departure": departure, "sketch_error": error, "seed_meta": [x.meta for x in results],
           "held_out_records_passing_extraction": list(held_out_record_rate(results)),
           "load_average": list(os.getloadavg())}
    return r.write(out, command=ctx.command, timings=timings, device="cpu")
