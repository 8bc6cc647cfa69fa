"""Sketched GNQ against exact GNQ, as the sketch dimension grows (issue 34, DESIGN.md §9).

    python -m benchmarks.sketch_error            # tiny GPT-2 (tied head) and Llama, float64, CPU

Each model (built from config, width 128, 2 layers, a 2,048-token BPE vocabulary trained on AG
News) is trained a little (AdamW on the audited texts) so that companions explain part of each
gradient; then one batch of B texts is audited once per (variant, k, seed) by ``WindowAuditor``
in sketch mode with the exact kernel kept, so the exact and sketched K come from the same pass.
λ = c · mean K_jj.  Reported per row: GNQ relative error |ĜNQ − GNQ| / GNQ (median, 95th
percentile), Spearman(ĜNQ, GNQ), K_jj relative error (median), the sketch's width per text,
and the median share of a gradient explained by its companions (1 − GNQ·λ/K_jj, exact).

Variants (how the vocabulary-sized parameters — embeddings and output head — are treated;
every other weight matrix gets a Kronecker Gaussian sketch of k = k_A·k_B, √k per side):
* ``kron-all``: like every other matrix (√k × √k Gaussian).
* ``vocab-exact``: kept whole (their Gram exact; a reference point, not an option for the
  window since it is the full V×d gradient).
* ``vocab-count-R``: the vocabulary side CountSketched to R buckets, the hidden side whole;
  ``vocab-count-RxC``: the hidden side Gaussian-projected to C.

``--totals`` (dimensions of the shared vector every parameter's sketch is folded into; ``none``:
side by side) and ``--columns`` (projected columns per side over all weight matrices; ``none``:
k / b per matrix) add the layout's two knobs.  ``--families smollm2`` audits the real
SmolLM2-135M-Instruct (30 layers, 210 weight matrices, float32) on ``--batch`` AG News texts
without training: the deep-model case, where the columns budget leaves few blocks per matrix.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.sketch.projection import Sketcher, SketchSpec
from gnq_core.engine.math.solve import gnq_from_kernel
from gnq_core.engine.passes.window import WindowAuditor
from gnq_core.sources.models import train_tokenizer
from gnq_core.sources.tokens import collate, encode_texts, pad_id

from .common import write

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "ag_news" / "train_2000.csv"
SMOLLM2 = Path("/root/.cache/gnq-audit/models/smollm2-135m-instruct")


def texts(n: int) -> list[str]:
    with DATA.open(newline="", encoding="utf-8") as f:
        return [f"{title}. {desc}" for _, title, desc in csv.reader(f)][:n]


def build(family: str, vocab: int, width: int) -> torch.nn.Module:
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=width, n_layer=2,
                                          n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                          bos_token_id=0, eos_token_id=0))
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, tie_word_embeddings=False,
                                        pad_token_id=0, bos_token_id=0, eos_token_id=0))


def rank(x: torch.Tensor) -> torch.Tensor:
    return torch.argsort(torch.argsort(x)).to(torch.float64)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = rank(a), rank(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra @ rb) / (ra.norm() * rb.norm()))


def quantile(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x, q))


def variant_spec(variant: str, k: int, seed: int, vocab: int, block: int | None, total: int | None = None,
                 columns: int | None = None) -> tuple[SketchSpec, bool]:
    """(spec, treat vocabulary parameters apart)."""
    layout = {"block": block, "total": total, "columns": columns}
    if variant == "kron-all":
        return SketchSpec(k=k, seed=seed, **layout), False
    if variant == "vocab-exact":
        return SketchSpec(k=k, seed=seed, vocab_rows=vocab, vocab_cols=None, **layout), True
    rows, _, cols = variant.rsplit("-", 1)[1].partition("x")
    return SketchSpec(k=k, seed=seed, vocab_rows=int(rows), vocab_cols=int(cols) if cols else None,
                      **layout), True


def representations(model, batch) -> tuple[torch.Tensor, dict[str, list], frozenset[str], int]:
    """(exact K, every parameter's representations, vocabulary keys) from one audited pass: an
    exact window of one micro-batch keeps the representations the sketches are made from."""
    with WindowAuditor(model, 1.0, mode="exact", window_budget=1 << 40) as aud:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        aud.backward(per_example_lm_loss(out.logits, batch.labels).sum())
        result = aud.add_micro_batch()
        reps = aud._window[0].reps
        vocab, matrices = aud.sketcher.vocab, aud.sketcher.matrices
    return result.kernel, reps, vocab, matrices or 0


def sketch_all(reps: dict[str, list], spec: SketchSpec, vocab: frozenset[str], matrices: int) -> torch.Tensor:
    """[B, m]: every parameter's sketch (its uses summed), laid out as a window lays them out."""
    return Sketcher(spec, vocab, matrices).sketch_all(reps)


def gnq_of(K: torch.Tensor, lam: float) -> torch.Tensor:
    return gnq_from_kernel(K, lam).gnq


def smollm2(B: int, length: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).train()
    ids = [tok(t)["input_ids"][:length] for t in texts(B)]
    return model, collate(ids, list(range(B)), tok.pad_token_id or 0)


def run(family: str, B: int, length: int, width: int, vocab: int, steps: int, lam_c: float,
        ks: list[int], variants: list[str], blocks: list[int | None], seeds: int,
        totals: list[int | None] = (None,), columns: list[int | None] = (None,)) -> dict:
    torch.manual_seed(0)
    if family == "smollm2":  # the real model, float32, not trained here
        model, batch = smollm2(B, length)
        steps = 0
    else:
        corpus = texts(400)
        tok = train_tokenizer(corpus, vocab_size=vocab)
        ids = encode_texts(tok, corpus[:B], length)
        batch = collate(ids, list(range(B)), pad_id(tok))
        model = build(family, len(tok), width).double()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):  # trained a little on the audited texts: companions matter
        opt.zero_grad()
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        per_example_lm_loss(out.logits, batch.labels).mean().backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    V = model.config.vocab_size
    K, reps, vocab_apart, matrices = representations(model, batch)
    lam = lam_c * float(K.diagonal().mean())
    exact_gnq = gnq_of(K, lam)
    share = 1 - exact_gnq * lam / K.diagonal()
    rows = []
    grid = [(v, b, k, t, c) for v in variants for b in blocks for k in ks for t in totals for c in columns]
    for variant, block, k, total, cols in grid:
        for seed in range(seeds):
            spec, apart = variant_spec(variant, k, seed, V, block, total, cols)
            start = time.perf_counter()
            S = sketch_all(reps, spec, vocab_apart if apart else frozenset(), matrices)
            seconds = time.perf_counter() - start
            Ks = S @ S.T
            approx = gnq_of(Ks, lam)  # the same λ as the exact solve
            rel = (approx - exact_gnq).abs() / exact_gnq
            diag = (Ks.diagonal() - K.diagonal()).abs() / K.diagonal()
            rows.append({"family": family, "variant": variant, "block": spec.side, "k": k,
                         "total": spec.shared, "columns": cols, "matrices": matrices,
                         "blocks_per_matrix": spec.blocks(matrices), "seed": seed,
                         "width_per_text": S.shape[1],
                         "gnq_rel_median": float(rel.median()), "gnq_rel_p95": quantile(rel, 0.95),
                         "spearman": spearman(approx, exact_gnq),
                         "kjj_rel_median": float(diag.median()), "sketch_seconds": seconds})
            print({k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in rows[-1].items()},
                  flush=True)
    return {"family": family, "batch": B, "max_length": length, "width": width, "vocab": V,
            "train_steps": steps, "lam_c": lam_c, "lam": lam,
            "params": sum(p.numel() for p in model.parameters()),
            "share_explained_median": float(share.median()),
            "share_explained_p10_p90": [quantile(share, 0.1), quantile(share, 0.9)],
            "spearman_gnq_kjj": spearman(exact_gnq, K.diagonal()), "rows": rows}


def summary(results: list[dict]) -> list[dict]:
    """Per (family, variant, block, k): medians over seeds, and the worst seed."""
    out = []
    for res in results:
        def key(r: dict) -> tuple:
            return r["variant"], r["block"], r["k"], r.get("total"), r.get("columns")

        for group in sorted({key(r) for r in res["rows"]}, key=str):
            rs = [r for r in res["rows"] if key(r) == group]
            variant, block, k, total, cols = group
            out.append({"family": res["family"], "variant": variant, "block": block, "k": k, "total": total,
                        "columns": cols, "blocks_per_matrix": rs[0].get("blocks_per_matrix"),
                        "seeds": len(rs),
                        "width_per_text": rs[0]["width_per_text"],
                        **{m: statistics.median(r[m] for r in rs)
                           for m in ("gnq_rel_median", "gnq_rel_p95", "spearman", "kjj_rel_median")},
                        "worst_seed_spearman": min(r["spearman"] for r in rs),
                        "worst_seed_gnq_rel_median": max(r["gnq_rel_median"] for r in rs)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=24)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lam", type=float, default=1e-3, help="c of λ = c · mean K_jj")
    ap.add_argument("--k", type=int, nargs="+", default=[64, 256, 1024, 4096])
    ap.add_argument("--variants", nargs="+", default=["kron-all", "vocab-exact", "vocab-count-256",
                                                      "vocab-count-1024", "vocab-count-1024x32"])
    ap.add_argument("--blocks", nargs="+", default=["8", "4", "root"],
                    help="side of each Kronecker block (root: √k, one block)")
    ap.add_argument("--totals", nargs="+", default=["none"],
                    help="shared vector dimensions (none: side by side)")
    ap.add_argument("--columns", nargs="+", default=["none"],
                    help="columns per side over all matrices (none: k/b each)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--families", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--name", default="sketch_error")
    args = ap.parse_args()
    torch.set_num_threads(1)
    blocks = [None if b == "root" else int(b) for b in args.blocks]
    totals = [None if t == "none" else int(t) for t in args.totals]
    columns = [None if c == "none" else int(c) for c in args.columns]
    results = [run(f, args.batch, args.length, args.width, args.vocab, args.steps, args.lam, args.k,
                   args.variants, blocks, args.seeds, totals, columns) for f in args.families]
    table = summary(results)
    path = write(args.name, {"threads": 1, "dtype": "float64", "results": results, "summary": table})
    for row in table:
        print(row)
    print(path)


if __name__ == "__main__":
    main()
