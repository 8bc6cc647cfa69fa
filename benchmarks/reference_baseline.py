"""A reference-style baseline next to the exact GNQ: its cost, and how well it ranks examples.

    python -m benchmarks.reference_baseline

The paper's GPT-2 code hooks only ``nn.Linear`` layers — in GPT-2 that is just ``lm_head``,
since the blocks use HF ``Conv1D`` — and flattens each sequence, so a layer's Gram is
(X Xᵀ) ⊙ (Δ Δᵀ) with X, Δ reshaped to [B, T·d]: position pairs are mixed up and every other
parameter is left out.  Here both run on the same batches of real text (WikiText-2) through a
GPT-2 of the CPU benchmark's shape that was first trained for a few steps, and we report:

* time per training step: plain, with the baseline's hooks, with the exact auditor (unfused
  and fused), median of interleaved repeats;
* the Spearman rank correlation of the baseline's GNQ with the exact GNQ, per batch and pooled.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core import GNQAuditor, per_example_lm_loss
from gnq_core.engine.math.solve import gnq_from_kernel, unweight_kernel
from gnq_core.sources.models import train_tokenizer
from gnq_core.sources.tokens import collate, encode_texts

from .common import interleaved, write

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext2" / "wiki.valid.raw"


class LinearOnlyFlattened:
    """The reference-style kernel: nn.Linear layers only, sequences flattened to one vector."""

    def __init__(self, model: nn.Module) -> None:
        self.kernel: torch.Tensor | None = None
        self.covered = 0
        self._handles = []
        for module in model.modules():
            if type(module) is nn.Linear:
                self.covered += sum(p.numel() for p in module.parameters() if p.requires_grad)
                self._handles.append(module.register_forward_hook(self._on_forward))

    def _on_forward(self, module, args, output) -> None:
        B = output.shape[0]
        x = args[0].detach().reshape(B, -1).double()
        output.register_hook(functools.partial(self._on_grad, x, module.bias is not None))

    def _on_grad(self, x: torch.Tensor, bias: bool, grad: torch.Tensor) -> None:
        d = grad.detach().reshape(grad.shape[0], -1).double()
        dd = d @ d.T
        block = (x @ x.T) * dd + (dd if bias else 0)
        self.kernel = block if self.kernel is None else self.kernel + block

    def gnq(self, weights: torch.Tensor, lam: float) -> torch.Tensor:
        kernel, self.kernel = self.kernel, None
        return gnq_from_kernel(unweight_kernel(kernel, weights), lam).gnq

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation (continuous scores: ties have probability zero)."""
    ra = a.argsort().argsort().double()
    rb = b.argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def wikitext_paragraphs(min_chars: int = 200) -> list[str]:
    if not WIKITEXT.exists():
        raise SystemExit(f"{WIKITEXT}: not found (the shared WikiText-2 copy is needed)")
    lines = WIKITEXT.read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if len(s.strip()) >= min_chars and not s.strip().startswith("=")]


def run(batch: int, length: int, n_batches: int, train_steps: int, repeats: int, lam: float) -> dict:
    torch.manual_seed(0)
    texts = wikitext_paragraphs()
    tokenizer = train_tokenizer(texts, vocab_size=8192)
    ids = encode_texts(tokenizer, texts, length)
    need = batch * (train_steps + n_batches)
    if len(ids) < need:
        raise SystemExit(f"{WIKITEXT}: {len(ids)} paragraphs, {need} needed")
    batches = [collate(ids[i:i + batch], list(range(i, i + batch)), 0) for i in range(0, need, batch)]
    cfg = GPT2Config(n_positions=length, n_layer=4, n_embd=256, n_head=4, vocab_size=len(tokenizer),
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    weights = torch.full((batch,), 1.0 / batch, dtype=torch.float64)

    def losses(b):
        out = model(input_ids=b.input_ids, attention_mask=b.attention_mask)
        return per_example_lm_loss(out.logits, b.labels)

    def step(b, after=None):
        losses(b).mean().backward()
        result = after() if after is not None else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        return result

    for b in batches[:train_steps]:  # off random init, so gradients look like training's
        step(b)
    eval_batches = batches[train_steps:]

    # scores: both on the same batches and the same weights (no optimizer step in between)
    per_batch, exact_all, ref_all = [], [], []
    for b in eval_batches:
        ref = LinearOnlyFlattened(model)
        with GNQAuditor(model, lam=lam) as auditor:
            losses(b).mean().backward()
            exact = auditor.compute(weights=weights.float()).gnq
            coverage = auditor.coverage
        approx = ref.gnq(weights, lam)
        ref.close()
        model.zero_grad(set_to_none=True)
        per_batch.append(spearman(exact, approx))
        exact_all.append(exact)
        ref_all.append(approx)
    pooled = spearman(torch.cat(exact_all), torch.cat(ref_all))

    # cost: one training step each way, interleaved, on the evaluation batches in turn
    cursor = {"i": 0}

    def next_batch():
        cursor["i"] = (cursor["i"] + 1) % len(eval_batches)
        return eval_batches[cursor["i"]]

    def plain():
        step(next_batch())

    def baseline():
        ref = LinearOnlyFlattened(model)
        try:
            step(next_batch(), after=lambda: ref.gnq(weights, lam))
        finally:
            ref.close()

    def exact_variant(fused: bool):
        def fn():
            auditor = GNQAuditor(model, lam=lam, fused=fused, check_uses=False)
            try:
                step(next_batch(), after=lambda: auditor.compute(weights=weights.float()))
            finally:
                auditor.close()
        return fn

    variants = {"plain": plain, "baseline": baseline, "exact": exact_variant(False),
                "exact_fused": exact_variant(True)}
    for fn in variants.values():
        fn()
    times = interleaved(variants, repeats)
    base = times["plain"]["median_s"]
    return {
        "batch": batch, "length": length, "eval_batches": n_batches, "train_steps": train_steps,
        "lam": lam, "repeats": repeats, "data": str(WIKITEXT.relative_to(WIKITEXT.parents[3])),
        "parameters": coverage.trainable_numel, "covered_exact": coverage.covered_numel,
        "covered_baseline": LinearOnlyFlattened(model).covered,
        **{f"{k}_s": v["median_s"] for k, v in times.items()},
        **{f"{k}_ratio": v["median_s"] / base for k, v in times.items() if k != "plain"},
        "spearman_per_batch": per_batch,
        "spearman_mean": sum(per_batch) / len(per_batch),
        "spearman_min": min(per_batch),
        "spearman_pooled": pooled,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--batches", type=int, default=8, help="evaluation batches")
    ap.add_argument("--train-steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lam", type=float, default=1e-2)
    args = ap.parse_args()
    row = run(args.batch, args.length, args.batches, args.train_steps, args.repeats, args.lam)
    print(f"B={row['batch']} T={row['length']}: plain {row['plain_s']:.3f}s; baseline "
          f"{row['baseline_ratio']:.3f}x ({row['covered_baseline']:,} of {row['parameters']:,} parameters); "
          f"exact {row['exact_ratio']:.3f}x, fused {row['exact_fused_ratio']:.3f}x (all parameters)")
    print(f"Spearman(baseline, exact): mean over batches {row['spearman_mean']:.3f}, "
          f"min {row['spearman_min']:.3f}, pooled {row['spearman_pooled']:.3f}")
    path = write("reference_baseline", {"rows": [row]})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
