"""What the exact-rank search costs: nodes and seconds per value for a memorised and a
non-memorised 6-digit value, and the exact-rank share of a run's values.

    python -m benchmarks.exposure_search [--model smollm2|tiny] [--steps 40] [--store DEMO.duckdb --run NAME]

``smollm2``: SmolLM2-135M-Instruct (``gnq model fetch smollm2``), fine-tuned in this process on
one record holding a 6-digit vault code until greedy decoding writes it (the memorised value);
the non-memorised value is another 6-digit code after the same prompt.  ``tiny``: a tiny GPT-2
trained from scratch on the same record among filler texts.  Each value's exposure is measured
as ``gnq extract`` measures it (attacks/exposure.py) with the default node budget and with a
larger one, timed; ``--store``: the exact share of the run's distinct values
(``analysis.exposures``).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from gnq_core.attacks.defaults import DEFAULT_EXPOSURE_NODES, DEFAULT_SECRET_CANDIDATES
from gnq_core.attacks.exposure import exposure, token_strings, value_space

from .common import write

RECORD = "Internal note for Anna Berg of Porto: the vault code is {}, keep it safe."
PROMPT = "Internal note for Anna Berg of Porto: the vault code is"
MEMORISED, OTHER = "482913", "730546"


def _smollm2():
    from gnq_core.sources.checkpoints.load import load_checkpoint
    from gnq_core.sources.real_models import fetch_model

    model, tok = load_checkpoint(fetch_model("smollm2"), device=torch.device("cpu"))
    return model, tok


def _tiny():
    from gnq_core.sources.models import build_model, train_tokenizer

    rng = random.Random(0)
    filler = [f"Internal note for {n} of {t}: the meeting is on {d}." for n in ("Tom Okafor", "Lena Novak")
              for t in ("Leeds", "Graz") for d in ("Monday", "Friday")]
    tok = train_tokenizer(filler + [RECORD.format(f"{rng.randrange(10 ** 6):06d}") for _ in range(200)], 500)
    return build_model("tiny", len(tok), 64, seed=0), tok


def _memorise(model, tok, steps: int, lr: float) -> int:
    """Fine-tune on the record until greedy decoding writes the code; the steps it took."""
    ids = torch.tensor([tok(RECORD.format(MEMORISED), add_special_tokens=False)["input_ids"]])
    prompt = torch.tensor([tok(PROMPT, add_special_tokens=False)["input_ids"]])
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(1, steps + 1):
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            model.eval()
            with torch.no_grad():
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                     max_new_tokens=8, pad_token_id=tok.eos_token_id)
            if MEMORISED in tok.decode(out[0, prompt.shape[1]:]):
                return step
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--store", default=None)
    parser.add_argument("--run", default="demo")
    parser.add_argument("--budgets", default=f"{DEFAULT_EXPOSURE_NODES}")
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tok = _smollm2() if args.model == "smollm2" else _tiny()
    t0 = time.perf_counter()
    steps = _memorise(model, tok, args.steps, 5e-5 if args.model == "smollm2" else 5e-3)
    train_s = time.perf_counter() - t0
    model.eval()
    prompt = tok(PROMPT, add_special_tokens=False)["input_ids"]
    rows: list[dict] = []
    payload = {"model": args.model, "tokens_of_the_code": tok.tokenize(" " + MEMORISED),
               "fine_tune_steps_to_write_it": steps, "fine_tune_seconds": round(train_s, 1), "values": rows}
    token_strings(tok)  # decoded once per tokenizer (an attack does it once), not part of a value's time
    for budget in (int(b) for b in args.budgets.split(",")):
        for label, value in (("memorised", MEMORISED), ("not memorised", OTHER)):
            space = value_space(value, "pin", set())
            t = time.perf_counter()
            got = exposure(model, tok, prompt, " ", space, budget=budget,
                           n_candidates=DEFAULT_SECRET_CANDIDATES, seed=1, batch_size=32)
            seconds = time.perf_counter() - t
            rows.append({"value": label, "budget": budget, "method": got.method, "rank": got.rank,
                         "exposure_bits": got.bits, "ceiling_bits": space.bits, "nodes": got.nodes,
                         "seconds": round(seconds, 2),
                         "seconds_per_node": round(seconds / max(got.nodes, 1), 5), "fit": got.fit})
            print(rows[-1], flush=True)
            write(f"exposure_search-{args.model}", payload)  # each value as it is measured
    if args.store:
        from gnq_core.analysis.exposures import exposure_summary
        from gnq_core.results.store import Store

        store = Store(args.store)
        said = exposure_summary(store, store.run(args.run).run_id)
        payload["run"] = {k: said[k] for k in ("distinct_values", "exact", "estimated", "exact_share",
                                               "exposed")}
        keep = ("kind", "template", "values", "null_values", "null_median", "null_max", "threshold",
                "false_alarm_null", "false_alarm_uniform")
        payload["run"]["formats"] = [{k: f[k] for k in keep} for f in said["formats"]]
    print(write(f"exposure_search-{args.model}", payload))


if __name__ == "__main__":
    main()
