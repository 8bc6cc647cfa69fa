"""The exposure estimate against exact ranks: every value of a 4-free-digit space (10^4) scored,
so each value's exact rank is known, and the estimate gnq extract uses when the exact search
cannot finish (attacks/exposure_sampling.py: importance sampling from the model's own
distribution) compared with it, beside the skew-normal tail it replaced.

    python -m benchmarks.exposure_estimate [--model tiny|smollm2] [--prompts 3] [--values 100]
                                           [--candidates 32,128,512]

``tiny``: a tiny GPT-2 trained from scratch on records holding 4-digit PINs (so its distribution
over them is far from flat; none of the measured values is memorised).  ``smollm2``:
SmolLM2-135M-Instruct as it is (``gnq model fetch smollm2``).  Per prompt: every value's
log-likelihood (its exact rank), one draw of the proposal per candidate count (shared by every
value of the prompt, as in a run), ``--values`` values uniformly at random and the 20 most likely
(the tail a memorised value sits in) estimated, error = estimated − exact exposure in bits.
Passing: median |error| ≤ 0.5 bit and at most 10% of values off by more than 2 bits, at the
default candidate count.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import numpy as np
import torch

from gnq_core.attacks import exposure_sampling
from gnq_core.attacks.defaults import DEFAULT_SECRET_CANDIDATES
from gnq_core.attacks.exposure import PromptScorer, ValueSpace, _tail, estimate_bits, token_strings

from .common import write

TEMPLATE = "Account of {}: the door PIN is {}, keep it safe."
NAMES = ["Anna Berg", "Tom Okafor", "Lena Novak", "Ravi Shah", "Ines Costa", "Omar Haddad"]
TOP = 20


def _tiny():
    from gnq_core.sources.models import build_model, train_tokenizer

    rng = random.Random(0)
    texts = [TEMPLATE.format(rng.choice(NAMES), f"{rng.randrange(10_000):04d}") for _ in range(400)]
    tok = train_tokenizer(texts, 420)
    model = build_model("tiny", len(tok), 64, seed=0)
    ids = [tok(t)["input_ids"] for t in texts[:128]]
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(20):  # a distribution over PINs with structure, none of them memorised
        for s in range(0, len(ids), 16):
            batch = ids[s: s + 16]
            width = max(map(len, batch))
            x = torch.tensor([t + [0] * (width - len(t)) for t in batch])
            mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in batch])
            loss = model(input_ids=x, attention_mask=mask, labels=x.masked_fill(mask == 0, -100)).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval(), tok


def _smollm2():
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.real_models import fetch_model

    return load_checkpoint(fetch_model("smollm2"), device=torch.device("cpu"))


def _summary(errors: list[float]) -> dict:
    e = np.asarray(errors, dtype=float)
    return {"values": len(e), "median_abs_error_bits": round(float(np.median(np.abs(e))), 3),
            "mean_error_bits": round(float(e.mean()), 3), "share_over_2_bits": round(float((np.abs(e) > 2).mean()), 3),
            "share_overestimated": round(float((e > 0).mean()), 3), "worst_bits": round(float(e[np.argmax(np.abs(e))]), 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--values", type=int, default=100)
    parser.add_argument("--candidates", default=f"32,{DEFAULT_SECRET_CANDIDATES},512")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tag", default="", help="appended to the results file's name")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tok = _tiny() if args.model == "tiny" else _smollm2()
    model.eval()
    strings = token_strings(tok)
    counts = [int(c) for c in args.candidates.split(",")]
    space = ValueSpace("0000", (0, 1, 2, 3))
    values = [space.fill(f"{k:04d}") for k in range(space.size)]
    rng = np.random.default_rng(0)
    errors: dict[str, list[float]] = {f"importance_{n}": [] for n in counts} | {"skew_normal": []}
    top_errors: dict[str, list[float]] = {k: [] for k in errors}
    prompts = []
    for p, name in enumerate(NAMES[: args.prompts]):
        prompt = tok(f"Account of {name}: the door PIN is", add_special_tokens=False)["input_ids"]
        scorer = PromptScorer(model, prompt, args.batch_size)
        t = time.perf_counter()
        with torch.inference_mode():
            scores = scorer.scores([_tail(" ", v, tok) for v in values])
        enumerate_s = time.perf_counter() - t
        ordered = np.sort(scores)
        exact_rank = len(scores) - np.searchsorted(ordered, scores, side="left")  # 1 + others at least as likely
        picked = rng.choice(space.size, args.values, replace=False)
        top = np.argsort(-scores)[:TOP]
        uniform_sample = rng.choice(space.size, DEFAULT_SECRET_CANDIDATES, replace=False)
        draw_s = {}
        for n in counts:
            t = time.perf_counter()
            draws = exposure_sampling.draw(scorer, tok, space, " ", n, 1000 * p + n, strings)
            draw_s[n] = round(time.perf_counter() - t, 2)
            for which, out in ((picked, errors), (top, top_errors)):
                for i in which:
                    others = scores[uniform_sample[uniform_sample != i]][: DEFAULT_SECRET_CANDIDATES - 1]
                    bits, _, _ = exposure_sampling.estimate(  # as gnq extract: with its uniform sample
                        draws, values[i], float(scores[i]), space.bits,
                        beaten=int((others >= scores[i]).sum()), uniform=len(others))
                    out[f"importance_{n}"].append(bits - (space.bits - math.log2(exact_rank[i])))
        for which, out in ((picked, errors), (top, top_errors)):
            for i in which:
                others = scores[uniform_sample[uniform_sample != i]][: DEFAULT_SECRET_CANDIDATES - 1]
                bits, _ = estimate_bits(float(scores[i]), others, space.bits)
                out["skew_normal"].append(bits - (space.bits - math.log2(exact_rank[i])))
        prompts.append({"prompt": f"Account of {name}: the door PIN is", "enumerate_seconds": round(enumerate_s, 1),
                        "draw_seconds": draw_s, "exact_exposure_of_most_likely": round(
                            space.bits - math.log2(int(exact_rank[top[0]])), 2)})
        print(prompts[-1], flush=True)
    default = f"importance_{DEFAULT_SECRET_CANDIDATES}"
    result = {"uniform_values": {k: _summary(v) for k, v in errors.items()},
              f"top_{TOP}_values": {k: _summary(v) for k, v in top_errors.items()}}
    judged = result["uniform_values"].get(default)
    payload = {"model": args.model, "space": "4 free digits (10^4 values), every value scored", "prompts": prompts,
               "values_per_prompt": args.values, "candidates": counts, "default_candidates": DEFAULT_SECRET_CANDIDATES,
               "error": "estimated - exact exposure (bits)", "result": result,
               "passes": bool(judged and judged["median_abs_error_bits"] <= 0.5 and judged["share_over_2_bits"] <= 0.1)}
    print(result)
    print(write(f"exposure_estimate-{args.model}{args.tag}", payload))


if __name__ == "__main__":
    main()
