"""A `GNQTrainer` optimizer step against a plain `transformers.Trainer` step, interleaved rounds.

    OMP_NUM_THREADS=1 python -m benchmarks.trainer_step                # SmolLM2-135M shape, B8 T64
    OMP_NUM_THREADS=1 python -m benchmarks.trainer_step --shape small  # a quick look

The model: SmolLM2-135M-Instruct's local copy when there is one
(``~/.cache/gnq-audit/models/smollm2-135m-instruct``, ``gnq model fetch smollm2``), else a Llama
built from SmolLM2-135M's config (30 layers, width 576, 9 heads / 3 key-value heads, MLP 1536,
tied 49,152-row embedding) with random weights — the step's cost depends on the shapes, not the
values; the results say which.  Each round trains every variant for ``--steps`` optimizer steps
on the same random token ids (one torch thread, AdamW, no logging, no saving): ``plain``
(Trainer), ``step`` (GNQTrainer's default: GNQ over the texts of one optimizer step, exact) and
``micro`` (``GNQConfig(gnq_batch="micro-batch")``: each micro-batch's GNQ, fused weight
gradient).  A step is timed in this process's CPU seconds (``time.process_time``, from the
Trainer's ``on_step_begin`` to ``on_step_end``; a round's first step, which builds the optimizer
state and the auditor's plan, is left out), so the neighbours' load does not count.  Reported: the
median step of each variant and the median of the per-round ratios to ``plain``; results in
``benchmarks/results/trainer_step-<label>-cpu.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from .common import write

LOCAL = Path.home() / ".cache" / "gnq-audit" / "models" / "smollm2-135m-instruct"
SHAPES = {  # hidden, layers, intermediate, heads, kv heads, vocab
    "smollm2": (576, 30, 1536, 9, 3, 49152),
    "small": (128, 4, 344, 4, 2, 4096),
}


def model_for(shape: str):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if shape == "smollm2" and LOCAL.is_dir():
        return AutoModelForCausalLM.from_pretrained(LOCAL, dtype=torch.float32), f"{LOCAL} (real weights)"
    hidden, layers, inter, heads, kv, vocab = SHAPES[shape]
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                         max_position_embeddings=2048, tie_word_embeddings=True, rms_norm_eps=1e-5,
                         rope_theta=100000.0)
    torch.manual_seed(0)
    which = "SmolLM2-135M's config" if shape == "smollm2" else "a small config"
    return LlamaForCausalLM(config), f"Llama from {which}, random weights (no local copy of SmolLM2)"


class StepClock:
    """Trainer callback: this process's CPU seconds of each optimizer step."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        clock = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, *args, **kwargs):
                clock.start = time.process_time()

            def on_step_end(self, *args, **kwargs):
                clock.steps.append(time.process_time() - clock.start)

        self.callback = _Callback()
        self.steps: list[float] = []
        self.start = 0.0


def one_round(variant: str, model, rows, args_kwargs: dict, work: Path) -> list[float]:
    from transformers import Trainer, TrainingArguments

    from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator

    clock = StepClock()
    args = TrainingArguments(output_dir=str(work / variant), **args_kwargs)
    common = dict(model=model, args=args, train_dataset=rows, data_collator=lm_collator(0),
                  callbacks=[clock.callback])
    if variant == "plain":
        collate = lm_collator(0)

        def plain_collator(batch):
            out = collate(batch)
            out.pop("example_id", None)
            return out

        trainer = Trainer(**(common | {"data_collator": plain_collator}))
    else:
        config = GNQConfig(out=work / f"shards-{variant}-{len(os.listdir(work))}",
                           **({"gnq_batch": "micro-batch"} if variant == "micro" else {}))
        trainer = GNQTrainer(**common, gnq=config)
    trainer.train()
    return clock.steps[1:]  # the first step builds the optimizer state and the auditor's plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per variant per round")
    parser.add_argument("--variants", nargs="+", default=["plain", "step", "micro"])
    parser.add_argument("--label", default="after")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import transformers

    transformers.logging.set_verbosity_error()
    model, what = model_for(args.shape)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    n = args.batch * args.steps
    rows = [{"input_ids": torch.randint(0, vocab, (args.length,), generator=g).tolist(), "example_id": i}
            for i in range(n)]
    kwargs = dict(per_device_train_batch_size=args.batch, max_steps=args.steps, learning_rate=1e-5,
                  report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                  dataloader_num_workers=0, disable_tqdm=True, seed=0, remove_unused_columns=False)
    load = [os.getloadavg()[0]]
    result: dict = {}
    path = None
    steps: dict[str, list[float]] = {v: [] for v in args.variants}
    ratios: dict[str, list[float]] = {v: [] for v in args.variants if v != "plain"}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            medians = {}
            for variant in args.variants:
                model.load_state_dict(initial)  # every variant from the same weights
                times = one_round(variant, model, rows, kwargs, Path(tmp))
                steps[variant] += times
                medians[variant] = statistics.median(times)
            for v in ratios:
                ratios[v].append(medians[v] / medians["plain"])
            print(f"round {r + 1}: " + ", ".join(f"{v} {s:.2f} s" for v, s in medians.items()), flush=True)
            # written after every round: a run cut short keeps the rounds it finished
            result = {"model": what, "batch": args.batch, "length": args.length, "rounds": r + 1,
                      "steps_per_round": args.steps, "clock": "process_time, one torch thread",
                      "load_average": [*load, os.getloadavg()[0]],
                      "median_step_s": {v: statistics.median(t) for v, t in steps.items()},
                      "all_step_s": steps,
                      "median_ratio_to_plain": {v: statistics.median(x) for v, x in ratios.items()},
                      "ratios_by_round": ratios}
            path = write(f"trainer_step-{args.label}", result)
    print({k: result[k] for k in ("median_step_s", "median_ratio_to_plain")}, "->", path)


if __name__ == "__main__":
    main()
