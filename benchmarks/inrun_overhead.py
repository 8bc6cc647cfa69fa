"""In-run overhead: a GPT-2-shaped training step with vs without GNQAuditor (paper Table 1).

    python -m benchmarks.inrun_overhead                      # CPU shape: 4 layers, width 256
    python -m benchmarks.inrun_overhead --preset gpt2-small  # GPU: GPT-2 small, random init
    python -m benchmarks.gpu_suite                           # every GPU measurement, one command

Same batches, interleaved repeats, median; all parameters covered exactly (the paper's code
hooks Linear layers only).  Extra peak memory is measured on CUDA.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from gnq_core import GNQAuditor, per_example_lm_loss

from .common import interleaved_timed, write

PRESETS = {
    "cpu-small": dict(n_layer=4, n_embd=256, n_head=4, vocab_size=8192),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257),
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257),
    # a 1B-class Llama shape (Llama 3.2 1B: 16 layers × 2048, GQA 32/8 heads, tied embeddings)
    "llama-1b": dict(llama=True, num_hidden_layers=16, hidden_size=2048, intermediate_size=8192,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     tie_word_embeddings=True),
    # SmolLM2-135M's shape (30 layers × 576, GQA 9/3 heads, tied 49,152-row embedding), random init
    "smollm2-135m": dict(llama=True, num_hidden_layers=30, hidden_size=576, intermediate_size=1536,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         tie_word_embeddings=True),
}
PRECISIONS = ("fp32", "bf16", "tf32")  # bf16: autocast, fp32 master weights; tf32: TF32 matmuls


def build(preset: str, length: int) -> torch.nn.Module:
    """A randomly initialised model of the preset's shape (no download)."""
    spec = dict(PRESETS[preset])
    if spec.pop("llama", False):
        cfg = LlamaConfig(max_position_embeddings=max(length, 128), bos_token_id=0, eos_token_id=0, **spec)
        return LlamaForCausalLM(cfg)
    cfg = GPT2Config(n_positions=max(length, 128), bos_token_id=0, eos_token_id=0, **spec)
    return GPT2LMHeadModel(cfg)


def run(preset: str, batch: int, length: int, repeats: int, device: str, precision: str = "fp32") -> dict:
    torch.manual_seed(0)
    model = build(preset, length).to(device).train()
    vocab = model.config.vocab_size
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (batch, length), device=device)
    weights = torch.full((batch,), 1.0 / batch, device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"

    def step(auditor: GNQAuditor | None) -> None:
        with autocast:
            out = model(input_ids=ids)
            losses = per_example_lm_loss(out.logits, ids)
        losses.mean().backward()
        if auditor is not None:
            auditor.compute(weights=weights)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def variant(fused: bool | None):
        """Seconds of one training step; the auditor is attached for that step only, outside
        the timer (attaching hooks is a one-off cost of a training run, not of a step)."""
        def fn() -> float:
            auditor = None if fused is None else GNQAuditor(model, lam=1e-2, fused=fused, check_uses=False)
            try:
                sync()
                start = time.perf_counter()
                step(auditor)
                sync()
                return time.perf_counter() - start
            finally:
                if auditor is not None:
                    auditor.close()
        return fn

    with GNQAuditor(model, lam=1e-2) as auditor:  # once with the first-forward coverage check
        step(auditor)
        coverage = auditor.coverage
    variants = {"plain": variant(None), "audited": variant(False), "audited_fused": variant(True)}
    for fn in variants.values():  # warm-up
        fn()
    res = interleaved_timed(variants, repeats)
    out = {
        "preset": preset, "precision": precision, "batch": batch, "length": length, "repeats": repeats,
        "parameters": coverage.trainable_numel, "covered": coverage.covered_numel,
        **{f"{k}_s": v["median_s"] for k, v in res.items()},
        "overhead_ratio": res["audited"]["median_s"] / res["plain"]["median_s"],
        "overhead_ratio_fused": res["audited_fused"]["median_s"] / res["plain"]["median_s"],
        "all_s": {k: v["all_s"] for k, v in res.items()},
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
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--length", type=int, nargs="+", default=[128])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32")
    args = ap.parse_args()
    rows = []
    for b in args.batch:
        for t in args.length:
            row = run(args.preset, b, t, args.repeats, args.device, args.precision)
            rows.append(row)
            print(f"{args.preset} B={b} T={t}: plain {row['plain_s']:.3f}s, audited "
                  f"{row['audited_s']:.3f}s ({row['overhead_ratio']:.3f}x), fused "
                  f"{row['audited_fused_s']:.3f}s ({row['overhead_ratio_fused']:.3f}x)")
    path = write(f"inrun_overhead-{args.preset}", {"rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
