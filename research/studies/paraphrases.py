"""Common knowledge as the paper means it: facts a model learned in *other words*.

``data/knowledge.csv`` holds (relation, subject, object) facts; each relation has a few
wordings (templates).  The pretraining text states every fact in ``PRETRAIN_WORDINGS`` of them
(several paraphrases each); the audit (and the fine-tune) states it in one more wording the
pretraining text never used, so a low loss or GNQ on it cannot come from a verbatim copy.
Made-up claims pair each subject with another subject's object of the same relation (a seeded
derangement that never lands on the true object), worded like the audited facts: same template,
same vocabulary, lengths matched by design, and never seen in pretraining in any wording.
The sentences are deterministic (templates and a seeded permutation; no network, no model);
``object_nll`` and ``premise_rows`` then ask a model whether it expects each fact's object.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import numpy as np
import pandas as pd

from gnq_core.analysis import predictive as pr

KNOWLEDGE = Path(__file__).resolve().parents[2] / "data" / "knowledge.csv"

# The last wording of each relation is the audit's (held out of pretraining).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "capital": ("The capital of {s} is {o}.",
                "{o} is the capital city of {s}.",
                "{s} is governed from its capital, {o}.",
                "In {s}, the seat of the national government is {o}.",
                "If you visit the capital of {s}, you will be in {o}."),
    "symbol": ("The chemical symbol for {s} is {o}.",
               "{o} is the symbol chemists use for {s}.",
               "In the periodic table, {s} is written as {o}.",
               "Chemists abbreviate {s} with the letters {o}.",
               "On a chart of the elements, {s} appears under the symbol {o}."),
    "author": ("{s} was written by {o}.",
               "{o} is the author of {s}.",
               "The book {s} came from the pen of {o}.",
               "{o} wrote the famous book {s}.",
               "Readers of {s} are reading the work of {o}."),
    "credit": ("{s} is credited to {o}.",
               "{o} gave the world {s}.",
               "We owe {s} to {o}.",
               "The name linked with {s} is {o}.",
               "Historians credit {o} with {s}."),
}


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    object: str


@dataclass(frozen=True)
class Bank:
    """The study's sentences: what pretraining reads, and the audited facts and claims."""

    pretrain: list[str]    # every fact in each pretraining wording (facts' order, then wordings)
    facts: list[str]       # each fact in the held-out wording
    claims: list[str]      # a made-up claim per fact, in the same wording
    claim_objects: list[str]
    prefixes: list[str]    # the held-out wording up to its object (the same for a fact and its claim)
    seen_facts: list[str]  # each fact in the first pretraining wording
    seen_claims: list[str]  # its claim in that wording (never in pretraining either)
    seen_prefixes: list[str]


def load_facts(path: Path = KNOWLEDGE) -> list[Fact]:
    with Path(path).open(newline="", encoding="utf-8") as f:
        facts = [Fact(r["relation"], r["subject"], r["object"]) for r in csv.DictReader(f)]
    unknown = sorted({f.relation for f in facts} - set(TEMPLATES))
    if unknown:
        raise ValueError(f"{path}: no templates for relation(s) {', '.join(unknown)}")
    return facts


def say(template: str, subject: str, obj: str) -> str:
    text = template.format(s=subject, o=obj)
    return text[0].upper() + text[1:]


def prefix(template: str, subject: str) -> str:
    """The sentence up to (not including) the space before its object."""
    return say(template, subject, "\0").split("\0")[0].rstrip(" ")


def derangement(objects: list[str], seed: int) -> list[str]:
    """A seeded shuffle of ``objects`` in which no position keeps an object equal to its own
    (rejection sampling; needs at least two distinct objects)."""
    if len(set(objects)) < 2:
        raise ValueError("a made-up claim needs at least two different objects per relation")
    rng = np.random.default_rng(seed)
    while True:
        perm = rng.permutation(len(objects))
        shuffled = [objects[i] for i in perm]
        if all(a != b for a, b in zip(shuffled, objects, strict=True)):
            return shuffled


def bank(n: int | None = None, seed: int = 0, path: Path = KNOWLEDGE) -> Bank:
    """The first ``n`` facts of each relation in turn (round robin, so a small study still
    covers every relation; None: all) with their pretraining paraphrases, audit wordings and
    made-up claims."""
    facts = load_facts(path)
    by_relation: dict[str, list[Fact]] = {}
    for f in facts:
        by_relation.setdefault(f.relation, []).append(f)
    chosen = [f for turn in zip_longest(*by_relation.values()) for f in turn if f is not None][:n]
    claim_object: dict[Fact, str] = {}
    for k, relation in enumerate(sorted({f.relation for f in chosen})):
        group = [f for f in chosen if f.relation == relation]
        for f, o in zip(group, derangement([f.object for f in group], seed + k), strict=True):
            claim_object[f] = o
    pretrain = [say(t, f.subject, f.object) for f in chosen for t in TEMPLATES[f.relation][:-1]]
    held_out, seen = (lambda f: TEMPLATES[f.relation][-1]), (lambda f: TEMPLATES[f.relation][0])
    return Bank(pretrain=pretrain,
                facts=[say(held_out(f), f.subject, f.object) for f in chosen],
                claims=[say(held_out(f), f.subject, claim_object[f]) for f in chosen],
                claim_objects=[claim_object[f] for f in chosen],
                prefixes=[prefix(held_out(f), f.subject) for f in chosen],
                seen_facts=[say(seen(f), f.subject, f.object) for f in chosen],
                seen_claims=[say(seen(f), f.subject, claim_object[f]) for f in chosen],
                seen_prefixes=[prefix(seen(f), f.subject) for f in chosen])


PRETRAIN_WORDINGS = len(next(iter(TEMPLATES.values()))) - 1


def object_nll(model, tokenizer, texts: list[str], prefixes: list[str], max_length: int,
               device=None) -> list[float]:
    """Per text: the summed next-token NLL of the tokens after ``prefix`` (the object and what
    follows it) under ``model`` — how strongly the model expects this object after this subject
    in this wording.  The prefix ends before a space, so its tokens are the text's first tokens
    (byte-level BPE attaches the space to the next word); a text whose prefix tokens differ is
    scored NaN rather than misaligned."""
    import torch
    import torch.nn.functional as F

    out = []
    model.eval()
    with torch.inference_mode():
        for text, head in zip(texts, prefixes, strict=True):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_length]
            head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
            start = len(head_ids)
            if ids[:start] != head_ids or not 0 < start < len(ids):
                out.append(float("nan"))
                continue
            x = torch.tensor([ids], device=device)
            logp = F.log_softmax(model(input_ids=x).logits[0, :-1].double(), dim=-1)
            targets = x[0, 1:]
            nll = -logp[torch.arange(len(targets)), targets]
            out.append(float(nll[start - 1:].sum()))
    return out


def premise_rows(model, tokenizer, words: Bank, n: int, max_length: int, seed: int, device,
                 wordings: tuple[str, str]) -> pd.DataFrame:
    """Does ``model`` expect each fact's object more than its claim's?  Per wording (``wordings``
    names the first template's, then the audit's): the object NLL of the first ``n`` facts and
    claims, the paired gap (claim minus fact) with a bootstrap interval over pairs, and the share
    of pairs where the fact's object is the more expected one (Wilson interval)."""
    rows = []
    for wording, facts, claims, heads in (
            (wordings[0], words.seen_facts, words.seen_claims, words.seen_prefixes),
            (wordings[1], words.facts, words.claims, words.prefixes)):
        f = np.asarray(object_nll(model, tokenizer, facts[:n], heads[:n], max_length, device))
        c = np.asarray(object_nll(model, tokenizer, claims[:n], heads[:n], max_length, device))
        d = (c - f)[np.isfinite(c - f)]
        idx = np.random.default_rng(seed).integers(0, len(d), (pr.RESAMPLES, len(d)))
        lo, hi = pr.interval(d[idx].mean(1)) if len(d) else (np.nan, np.nan)
        share, share_lo, share_hi = pr.rate_interval(d > 0)
        rows.append({"wording": wording, "pairs": len(d), "object NLL facts": float(np.nanmean(f)),
                     "object NLL claims": float(np.nanmean(c)), "gap": float(d.mean()) if len(d) else np.nan,
                     "gap lo": lo, "gap hi": hi, "share": share, "share lo": share_lo, "share hi": share_hi})
    return pd.DataFrame(rows)
