"""Sketched GNQ against exact GNQ where the companions claims are made: c = 256 and all.

    python -m benchmarks.sketch_error_companions            # SmolLM2-135M, last layer audited
    python -m benchmarks.sketch_error_companions --quick    # tiny Llama, float64, identity check

``sketch_error.py`` measured the sketch at the base weights on one batch of 32; the companions
claims (``python -m research study companions``, ``gnq audit --companions 256|all``) rest on GNQ
of a text against hundreds of companions, where the companions explain more of each gradient
and the solve leans harder on the sketch.  Here the same quantity is computed twice on the same texts:

* sketched, by the production path (``pipelines.companions.audit_companions``, the code behind
  ``gnq audit --companions N|all``), with the audit's seeded companion sets (copies kept apart
  where the sets allow it);
* exactly, from explicit per-example gradients g_j = A_jᵀ C_j of every audited weight matrix
  (its inputs A_j and output gradients C_j, the product formed for every text), their Gram K in
  float64 and the same leave-one-out solve with the same λ on each set.

Exact gradients of all 135M parameters of 300 texts do not fit, so the audited parameter set is
reduced: every parameter is frozen (requires_grad False) but the weight matrices of the last
``--layers`` decoder layers (the production path audits what requires a gradient,
``trainable_only``).  The model is first fine-tuned a little on the texts (those matrices only,
one epoch, the study's learning rate), so that companions and copies explain part of each
gradient.  Texts: AG News rows plus planted records (the study's fictional records) at
``--copies`` copies each.

Sketches, per row of the table:
* ``production``: the audit's defaults (k = 4,096 per matrix, folded into 65,536 dimensions at
  c = 256, 16,384 against all).  With 7 matrices instead of SmolLM2's 210, the column budget
  leaves each matrix 64 blocks, where the whole model gets 10.
* ``production-full-blocks``: the same with k = 640, so each matrix gets the 10 blocks of 8 × 8
  the whole model's matrices get under the budget (the fold as above).
* ``study``: the companions study's sketch (k = 1,024 per matrix in 16 blocks, side by side,
  no fold), given to the production path as ``--sketch-k 1024`` with a total below k.

``--quick`` checks the comparison itself: a tiny float64 Llama whose every matrix is kept whole
(an identity-sized sketch) must give exact GNQ through the production path (relative error about
1e-12), and the exact Gram must equal ``engine.math.reference``'s torch.func gradients' Gram.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numpy as np
import torch
from scipy.stats import spearmanr
from torch import nn

from gnq_core.engine.sketch.companions import kernel_gnq
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.reference import per_example_gradients_func
from gnq_core.engine.sketch.projection import SketchSpec
from gnq_core.pipelines.companion_plan import sketch_spec
from gnq_core.pipelines.companions import audit_companions, companion_sets
from gnq_core.pipelines.settings import COMPANIONS_ALL, AuditSettings
from gnq_core.sources.tokens import collate, encode_texts, pad_id
from research.studies.companions import fine_tune

from .common import write

VARIANTS = {  # name: (sketch_k, sketch_total or None for the audit's default)
    "production": (4096, None),
    "production-full-blocks": (640, None),
    "study": (1024, 1),
}


# ----------------------------------------------------------------------------------------- texts
def texts_with_copies(n_corpus: int, records: int, copies: int, seed: int) -> tuple[list[str], np.ndarray]:
    """AG News rows then planted records ``copies`` times each; one cluster id per distinct text."""
    from research.studies.base import DEFAULT_DATA_DIR, ag_news
    from research.studies.companions import planted_records

    rows = list(dict.fromkeys(t for t, _ in ag_news(DEFAULT_DATA_DIR)))
    order = np.random.default_rng([seed, 49]).permutation(len(rows))[:n_corpus]
    texts = [rows[i] for i in order] + [r for r in planted_records(records, seed) for _ in range(copies)]
    _, clusters = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    return texts, clusters.astype(np.int64)


# ----------------------------------------------------------------------------------------- models
def smollm2(layers: int):
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.real_models import fetch_model

    model, tok = load_checkpoint(fetch_model("smollm2"))
    model = model.float()
    audit_only(model, layers)
    return model, tok


def tiny(texts: list[str]):
    from transformers import LlamaConfig, LlamaForCausalLM

    from gnq_core.sources.models import train_tokenizer

    tok = train_tokenizer(texts, vocab_size=300)
    conf = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=True, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(conf).double()
    audit_only(model, 1)
    return model, tok


def audit_only(model: nn.Module, layers: int) -> None:
    """Freeze every parameter but the weight matrices of the last ``layers`` decoder layers."""
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers[-layers:]:
        for mod in layer.modules():
            if isinstance(mod, nn.Linear):
                mod.weight.requires_grad_(True)


def audited(model: nn.Module) -> dict[str, nn.Linear]:
    mods = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.weight.requires_grad}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    if trainable != {id(m.weight) for m in mods.values()} or any(m.bias is not None for m in mods.values()):
        raise ValueError("the exact path covers bias-free Linear weights only")
    return mods


# ----------------------------------------------------------------------------------------- exact
def exact_gram(model: nn.Module, ids: list[list[int]], pad: int, batch: int = 16, chunk: int = 64
               ) -> torch.Tensor:
    """K [n, n] float64 from explicit per-example gradients of the audited matrices: each text's
    gradient of matrix W is A_jᵀ C_j (its inputs and its outputs' gradients of the text's own loss,
    pad positions zero), formed for every text a block of output columns at a time."""
    mods = audited(model)
    n, width = len(ids), max(len(x) for x in ids)
    dtype = next(model.parameters()).dtype  # held as computed, cast to float64 per matrix
    A = {k: torch.zeros(n, width, m.in_features, dtype=dtype) for k, m in mods.items()}
    C = {k: torch.zeros(n, width, m.out_features, dtype=dtype) for k, m in mods.items()}
    at = [0]
    handles = []

    def keep(name: str):
        def forward_hook(mod, inputs, output):
            rows = slice(at[0], at[0] + output.shape[0])
            A[name][rows, :output.shape[1]] = inputs[0].detach()

            def backward_hook(grad: torch.Tensor) -> None:
                C[name][rows, :grad.shape[1]] = grad.detach()

            output.register_hook(backward_hook)
        return forward_hook

    for name, mod in mods.items():
        handles.append(mod.register_forward_hook(keep(name)))
    try:
        for s in range(0, n, batch):
            at[0] = s
            b = collate(ids[s:s + batch], list(range(s, min(s + batch, n))), pad)
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
            per_example_lm_loss(logits, b.labels).sum().backward()  # texts are independent: C_j is j's
            model.zero_grad(set_to_none=True)
    finally:
        for h in handles:
            h.remove()
    K = torch.zeros(n, n, dtype=torch.float64)
    for name in mods:
        a = A.pop(name).double()
        c_all = C.pop(name)
        for e in range(0, c_all.shape[2], chunk):
            G = torch.einsum("ntd,nte->nde", a, c_all[:, :, e:e + chunk].double()).reshape(n, -1)
            K += G @ G.T
    return K


def check_exact(model: nn.Module, ids: list[list[int]], pad: int, K: torch.Tensor, texts: int) -> float:
    """Largest |K − K_ref| / max |K_ref| over the first ``texts`` texts, K_ref the Gram of
    ``engine.math.reference``'s torch.func per-example gradients (one text at a time)."""
    b = collate(ids[:texts], list(range(texts)), pad)

    def loss_fn(m, batch):
        input_ids, mask, labels = batch
        return per_example_lm_loss(m(input_ids=input_ids, attention_mask=mask).logits, labels)

    G = per_example_gradients_func(model, loss_fn, (b.input_ids, b.attention_mask, b.labels))
    ref = G @ G.T
    return float((K[:texts, :texts] - ref).abs().max() / ref.abs().max())


# ----------------------------------------------------------------------------------------- compare
def production(model, tok, texts: list[str], clusters: np.ndarray, c: int | str, k: int, total: int | None,
               seed: int, lam: float, max_length: int
               ) -> tuple[np.ndarray, list[np.ndarray], float, SketchSpec]:
    """(sketched GNQ per text, the companion sets, seconds, the sketch) by ``audit_companions``."""
    settings = AuditSettings(lam=lam, batch_size=16, max_length=max_length, seed=seed, companions=c,
                             sketch_k=k, sketch_total=total, dtype=str(next(model.parameters()).dtype)[6:])
    sets = companion_sets(len(texts), settings, clusters)
    t0 = time.perf_counter()
    spec = sketch_spec(settings)
    columns, _ = audit_companions(model, tok, texts, sets, range(len(sets)), settings, torch.device("cpu"),
                                  trainable_only=True)
    seconds = time.perf_counter() - t0
    gnq = np.full(len(texts), np.nan)
    gnq[columns.example_id[:len(columns)]] = columns.column("gnq")
    return gnq, [np.asarray(sets.batch(i)) for i in range(len(sets))], seconds, spec


def exact_on_sets(K: torch.Tensor, sets: list[np.ndarray], lam: float) -> np.ndarray:
    out = np.full(K.shape[0], np.nan)
    for members in sets:
        if len(members) >= 2:
            sub = K[np.ix_(members, members)].clone()
            out[members] = kernel_gnq(sub, lam)[0].numpy()
    return out


def errors(sketched: np.ndarray, exact: np.ndarray, kjj: np.ndarray, lam: float, keep: np.ndarray) -> dict:
    s, e = sketched[keep], exact[keep]
    signed = (s - e) / e
    rel = np.abs(signed)
    share = 1 - e * lam / kjj[keep]
    share_s = 1 - s * lam / kjj[keep]  # the sketched GNQ over the exact K_jj: the error of the share
    return {"texts": int(keep.sum()), "gnq_rel_median": float(np.median(rel)),
            "gnq_rel_p95": float(np.quantile(rel, 0.95)), "gnq_rel_max": float(rel.max()),
            "gnq_signed_rel_median": float(np.median(signed)),  # > 0: the sketch explains less
            "spearman": float(spearmanr(s, e).statistic),
            "share_explained_exact_median": float(np.median(share)),
            "share_explained_abs_error_median": float(np.median(np.abs(share_s - share))),
            "share_explained_abs_error_p95": float(np.quantile(np.abs(share_s - share), 0.95))}


def run(args) -> dict:
    torch.manual_seed(0)
    texts, clusters = texts_with_copies(args.corpus, args.records, args.copies, seed=0)
    t0 = time.perf_counter()
    model, tok = tiny(texts) if args.quick else smollm2(args.layers)
    pad = pad_id(tok)
    ids = encode_texts(tok, texts, args.max_length)
    losses = fine_tune(model, ids, pad, lr=args.lr, epochs=1, batch_size=8, seed=0)  # the audited matrices
    tuned = time.perf_counter() - t0
    t0 = time.perf_counter()
    K = exact_gram(model, ids, pad)
    exact_seconds = time.perf_counter() - t0
    check = check_exact(model, ids, pad, K, args.check_texts)
    print(f"exact Gram in {exact_seconds:.0f} s; against torch.func on {args.check_texts} texts: {check:.2e}",
          flush=True)
    kjj = K.diagonal().numpy().copy()
    copied = np.bincount(clusters)[clusters] > 1
    variants = {"identity": (1 << 20, 1)} if args.quick else {v: VARIANTS[v] for v in args.variants}
    rows = []
    for name, (k, total) in variants.items():
        for seed in range(args.seeds):
            for c in args.sizes:
                sketched, sets, seconds, spec = production(model, tok, texts, clusters, c, k, total, seed,
                                                           args.lam, args.max_length)
                exact = exact_on_sets(K, sets, args.lam)
                size = len(texts) - 1 if c == COMPANIONS_ALL else int(c)
                full = np.zeros(len(texts), bool)  # texts of sets of c + 1 (not the remainder set)
                for members in sets:
                    if len(members) == size + 1:
                        full[members] = True
                row = {"variant": name, "sketch_k": k, "sketch_total": total, "sketch": spec.describe(),
                       "blocks_per_matrix": spec.blocks(len(audited(model))), "seed": seed, "c": c,
                       "sets": [len(m) for m in sets], "audit_seconds": seconds,
                       "all": errors(sketched, exact, kjj, args.lam, full),
                       "unique texts": errors(sketched, exact, kjj, args.lam, full & ~copied),
                       "record copies": errors(sketched, exact, kjj, args.lam, full & copied)}
                rows.append(row)
                print({k_: v for k_, v in row.items() if k_ != "sets"}, flush=True)
    mods = audited(model)
    n_audited = sum(m.weight.numel() for m in mods.values())
    return {"model": "tiny Llama (float64)" if args.quick else "SmolLM2-135M-Instruct (float32)",
            "audited": f"the {len(mods)} weight matrices of the last {args.layers} decoder layer(s)",
            "audited_parameters": n_audited, "texts": len(texts), "corpus_texts": args.corpus,
            "records": args.records, "copies": args.copies, "max_length": args.max_length,
            "lam": args.lam, "lam_over_mean_kjj": args.lam / float(kjj.mean()),
            "fine_tune": {"epochs": 1, "lr": args.lr, "batch": 8, "first_loss": losses[0],
                          "last_loss": losses[-1], "seconds": tuned},
            "exact_seconds": exact_seconds, "exact_vs_torch_func_max_rel": check,
            "exact_vs_torch_func_texts": args.check_texts, "rows": rows, "summary": summary(rows)}


def summary(rows: list[dict]) -> list[dict]:
    """Per (variant, c): medians over sketch seeds of each error, over all texts of full sets."""
    out = []
    for key in dict.fromkeys((r["variant"], r["c"]) for r in rows):
        rs = [r["all"] for r in rows if (r["variant"], r["c"]) == key]
        out.append({"variant": key[0], "c": key[1], "seeds": len(rs), "texts": rs[0]["texts"],
                    **{m: statistics.median(r[m] for r in rs) for m in rs[0] if m != "texts"}})
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny float64 Llama, identity-sized sketch")
    ap.add_argument("--corpus", type=int, default=260, help="AG News texts")
    ap.add_argument("--records", type=int, default=10, help="planted records")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--layers", type=int, default=1, help="last decoder layers audited")
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--sizes", nargs="+", default=["256", COMPANIONS_ALL])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--check-texts", type=int, default=3)
    ap.add_argument("--name", default="sketch_error-companions")
    return ap


def sizes(args: argparse.Namespace) -> argparse.Namespace:
    """The companion sizes as the audit's settings take them (whole numbers, or 'all')."""
    args.sizes = [s if s == COMPANIONS_ALL else int(s) for s in args.sizes]
    return args


def main() -> None:
    args = sizes(parser().parse_args())
    torch.set_num_threads(1)
    t0, load = time.perf_counter(), os.getloadavg()
    result = run(args)
    result["seconds"] = time.perf_counter() - t0
    result["threads"] = 1
    # the machine is shared: its load (1-, 5-, 15-minute averages) when the run began and ended
    result["load_average"] = {"start": list(load), "end": list(os.getloadavg())}
    path = write(args.name, result)
    for row in result["summary"]:
        print({k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in row.items()})
    print(path)


if __name__ == "__main__":
    main()
