"""What tracking secrets while training costs, against the training it watches.

    OMP_NUM_THREADS=1 python -m benchmarks.secret_tracking              # small GPT-2, k = 50, 2,000 steps
    OMP_NUM_THREADS=1 python -m benchmarks.secret_tracking --steps 200 --max-overhead none --tag raw
    OMP_NUM_THREADS=1 python -m benchmarks.secret_tracking \
        --model ~/.cache/gnq-audit/models/smollm2-135m-instruct --steps 200 --lr 1e-4 --tag smollm2

A GPT-2 of the ``small`` preset (4 layers, 256 wide; a local BPE tokenizer of 2,048 tokens) trains
on the privacy scenario of tests/scenario_data.py (ordinary lines, unique secrets, customer
records repeated 4×: 188 texts, 36 of them holding a secret-like value) with AdamW, batch 8,
64 tokens.  Every ``k`` optimizer steps ``SecretTracker`` probes every value under the current
weights with the post-hoc attack's budget (greedy continuation, exposure with 128 candidates and
a 1,024-node exact search, the null of 20 never-trained values per format).  ``--model DIR``: a pretrained
causal LM from a Hugging Face folder (SmolLM2-135M-Instruct, float32) trains instead, with its own
tokenizer, on the same texts (``--lr`` its learning rate; the padding is masked by length, since
its pad token is also its end of text).  One torch thread;
CPU seconds of this process (``time.process_time``), so the neighbours' load does not count.
The cost is the probes' seconds over the training steps' seconds of the same run, with the
tracker's default ``max_overhead`` (0.10: due probes put off while they would cost more) or
``--max-overhead none`` (every k steps whatever it costs: the probe's raw price).  Exits 1 after
writing the results when it is above ``--max-ratio`` (default 0.10, the target at the default k).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from gnq_core import per_example_lm_loss
from gnq_core.attacks.defaults import DEFAULT_SECRET_CANDIDATES
from gnq_core.integrations.tracking import DEFAULT_EVERY, DEFAULT_MAX_OVERHEAD, SecretTracker, SecretTracking
from gnq_core.sources.models import build_model, train_tokenizer

from .common import write

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _model_and_tokenizer(model_dir: Path | None, preset: str, texts: list[str], length: int,
                         seed: int) -> tuple[torch.nn.Module, object]:
    """The pretrained model in ``model_dir`` with its tokenizer, or a fresh GPT-2 of ``preset``
    with a BPE tokenizer trained on the texts."""
    if model_dir is not None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return model, tok
    tok = train_tokenizer(texts, vocab_size=2048)
    model = build_model(preset, vocab_size=len(tok), max_length=length, seed=seed,
                        eos_token_id=tok.eos_token_id)
    return model, tok


def run(steps: int, every: int, batch: int, length: int, preset: str, seed: int,
        max_overhead: float | None, n_candidates: int = DEFAULT_SECRET_CANDIDATES,
        model_dir: Path | None = None, lr: float = 1e-3) -> dict:
    from scenario_data import scenario

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    texts = scenario(seed=seed)["text"].tolist()
    model, tok = _model_and_tokenizer(model_dir, preset, texts, length, seed)
    ids = [tok(t, add_special_tokens=False)["input_ids"][:length] for t in texts]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    tracker = SecretTracker(SecretTracking(tok, every=every, max_overhead=max_overhead,
                                           n_candidates=n_candidates), texts, ids, max_length=length)
    gen = torch.Generator().manual_seed(seed)
    train_s: list[float] = []
    probe_s: list[float] = []
    load_before = os.getloadavg()
    for step in range(1, steps + 1):
        pick = torch.randint(len(ids), (batch,), generator=gen).tolist()
        x = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids[i]) for i in pick], batch_first=True,
                                            padding_value=tok.pad_token_id)
        # By length, not by the pad id: a real tokenizer's pad token is its end of text.
        sizes = torch.tensor([len(ids[i]) for i in pick])
        mask = torch.arange(x.shape[1])[None, :] < sizes[:, None]
        start = time.process_time()
        model.train()
        logits = model(input_ids=x, attention_mask=mask).logits
        losses = per_example_lm_loss(logits, x.masked_fill(~mask, -100))
        losses.mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        train_s.append(time.process_time() - start)
        start = time.process_time()
        said = tracker.step(model, step)
        if said is not None:
            probe_s.append(time.process_time() - start)
    history = tracker.history()
    ratio = sum(probe_s) / sum(train_s)
    return {
        "settings": {"steps": steps, "every": every, "batch": batch, "length": length,
                     "model": Path(model_dir).name if model_dir is not None else f"gpt2-{preset}",
                     "lr": lr, "seed": seed, "texts": len(texts), "texts_with_values": tracker.values,
                     "values_probed": int(history.groupby("step").size().iloc[0]) if len(history) else 0,
                     "n_candidates": tracker.settings.n_candidates,
                     "search_nodes": tracker.settings.search_nodes, "max_overhead": max_overhead,
                     "parameters": sum(p.numel() for p in model.parameters())},
        "train_step_cpu_s": {"median": statistics.median(train_s), "total": sum(train_s)},
        "probe_cpu_s": {"per_probe": probe_s, "median": statistics.median(probe_s) if probe_s else None,
                        "total": sum(probe_s)},
        "probe_over_training": ratio,
        "probe_over_training_wall": tracker.overhead(),
        "probed_steps": sorted(int(s) for s in history["step"].unique()) if len(history) else [],
        "deferred_steps": tracker.deferred,
        "first_leaked_step": sorted(tracker.first_leaked.values()),
        "values_leaked_at_last_probe": int(history[history["step"] == history["step"].max()]["leaked"].sum())
        if len(history) else 0,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model", type=Path, default=None,
                        help="a Hugging Face causal-LM folder to fine-tune instead of a fresh "
                             "GPT-2 of --preset")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-overhead", default=str(DEFAULT_MAX_OVERHEAD),
                        help="SecretTracking max_overhead, or 'none' (probe every k steps whatever it costs)")
    parser.add_argument("--n-candidates", type=int, default=DEFAULT_SECRET_CANDIDATES,
                        help="exposure's random values (1: no exposure, greedy continuation alone)")
    parser.add_argument("--max-ratio", type=float, default=0.10)
    parser.add_argument("--tag", default="")
    a = parser.parse_args()
    limit = None if a.max_overhead.lower() == "none" else float(a.max_overhead)
    if a.model is not None and not (a.model / "config.json").is_file():
        sys.exit(f"{a.model}: no config.json there (a Hugging Face model folder is needed)")
    result = run(a.steps, a.every, a.batch, a.length, a.preset, a.seed, limit, a.n_candidates,
                 a.model, a.lr)
    result["max_ratio"] = a.max_ratio
    result["within_target"] = result["probe_over_training"] <= a.max_ratio
    path = write("secret_tracking" + (f"-{a.tag}" if a.tag else ""), result)
    probes, training = result["probe_cpu_s"]["total"], result["train_step_cpu_s"]["total"]
    print(f"probes {probes:.1f} s over training {training:.1f} s = {result['probe_over_training']:.1%} at "
          f"k = {a.every}, max_overhead {limit} ({path})")
    if not result["within_target"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
