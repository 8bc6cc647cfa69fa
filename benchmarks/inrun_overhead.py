"""In-run overhead: a GPT-2-shaped training step with vs without GNQAuditor (paper Table 1).

    python -m benchmarks.inrun_overhead                      # CPU shape: 4 layers, width 256
    python -m benchmarks.inrun_overhead --preset gpt2-small  # GPU: GPT-2 small, random init

Same batches, interleaved repeats, median; all parameters covered exactly (the paper's code
hooks Linear layers only).  Extra peak memory is measured on CUDA.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core import GNQAuditor, per_example_lm_loss

from .common import interleaved, write

PRESETS = {
    "cpu-small": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257),
}


def run(preset: str, batch: int, length: int, repeats: int, device: str) -> dict:
    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=max(length, 128), bos_token_id=0, eos_token_id=0, **PRESETS[preset])
    model = GPT2LMHeadModel(cfg).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (batch, length), device=device)
    weights = torch.full((batch,), 1.0 / batch, device=device)
    def step(auditor: GNQAuditor | None) -> None:
        out = model(input_ids=ids)
        per_example_lm_loss(out.logits, ids).mean().backward()
        if auditor is not None:
            auditor.compute(weights=weights)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def variant(fused: bool | None):
        """One training step; the auditor is attached only for the step (hooks off otherwise)."""
        def fn():
            if fused is None:
                return step(None)
            auditor = GNQAuditor(model, lam=1e-2, fused=fused, check_uses=False)
            try:
                step(auditor)
            finally:
                auditor.close()
        return fn

    with GNQAuditor(model, lam=1e-2) as auditor:  # once with the first-forward coverage check
        step(auditor)
        coverage = auditor.coverage
    variants = {"plain": variant(None), "audited": variant(False), "audited_fused": variant(True)}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for fn in variants.values():  # warm-up
        fn()
    res = interleaved(variants, repeats, sync)
    out = {
        "preset": preset, "batch": batch, "length": length, "repeats": repeats,
        "parameters": coverage.trainable_numel, "covered": coverage.covered_numel,
        **{f"{k}_s": v["median_s"] for k, v in res.items()},
        "overhead_ratio": res["audited"]["median_s"] / res["plain"]["median_s"],
        "overhead_ratio_fused": res["audited_fused"]["median_s"] / res["plain"]["median_s"],
    }
    if device == "cuda":
        peak = {}
        for name, fn in variants.items():
            torch.cuda.reset_peak_memory_stats()
            fn()
            peak[name] = torch.cuda.max_memory_allocated()
        out["peak_bytes"] = peak
        out["extra_peak_memory_ratio"] = peak["audited"] / peak["plain"] - 1
        out["extra_peak_memory_ratio_fused"] = peak["audited_fused"] / peak["plain"] - 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--length", type=int, nargs="+", default=[128])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    rows = []
    for b in args.batch:
        for t in args.length:
            row = run(args.preset, b, t, args.repeats, args.device)
            rows.append(row)
            print(f"{args.preset} B={b} T={t}: plain {row['plain_s']:.3f}s, audited "
                  f"{row['audited_s']:.3f}s ({row['overhead_ratio']:.3f}x), fused "
                  f"{row['audited_fused_s']:.3f}s ({row['overhead_ratio_fused']:.3f}x)")
    path = write(f"inrun_overhead-{args.preset}", {"rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
