"""Fine-tune a small causal LM with the Hugging Face Trainer and GNQ over every optimizer step.

    python examples/finetune_with_gnq.py                                   # one process
    python -m torch.distributed.run --nproc_per_node 2 examples/finetune_with_gnq.py   # B_eff: 8 × 2 × 2
    gnq ingest runs/finetune-gnq/shards --db data/gnq.duckdb               # then the dashboard

No network: the texts' bytes are the tokens and the model is a tiny GPT-2 built from config
(standing in for the checkpoint you would fine-tune; pass --init DIR to start from a saved
Hugging Face checkpoint folder and its tokenizer instead).  Each rank writes its own Parquet shards; nothing
waits on the database while training.  The only GNQ-specific lines are marked # GNQ.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, TrainingArguments

from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator  # GNQ

ROOT = Path(__file__).resolve().parents[1]
BYTES = 256  # the tiny model's tokens are the texts' UTF-8 bytes; id 256 pads


def model_and_encoder(init: Path | None, max_length: int):
    """The model, a function from text to token ids, and the padding id."""
    if init is None:
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=BYTES + 1, n_positions=max_length, n_embd=64, n_layer=2, n_head=2,
                            bos_token_id=BYTES, eos_token_id=BYTES)
        return GPT2LMHeadModel(config), lambda text: list(text.encode())[:max_length], BYTES
    tokenizer = AutoTokenizer.from_pretrained(init)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encode = lambda text: tokenizer(text, truncation=True, max_length=max_length)["input_ids"]  # noqa: E731
    return AutoModelForCausalLM.from_pretrained(init), encode, pad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "demo.csv")
    ap.add_argument("--init", type=Path, help="a Hugging Face checkpoint folder to fine-tune")
    ap.add_argument("--out", type=Path, default=Path("runs") / "finetune-gnq")
    ap.add_argument("--epochs", type=float, default=2)
    ap.add_argument("--max-steps", type=int, default=-1, help="stop after this many optimizer steps")
    ap.add_argument("--batch-size", type=int, default=8, help="per device (the GNQ micro-batch)")
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--lam", type=float, default=1e-2)
    ap.add_argument("--scope", choices=["rank", "global"],
                    help="whose texts form a GNQ batch: every process's (default with --gnq-batch step) "
                         "or this process's (default with micro-batch)")
    ap.add_argument("--gnq-batch", choices=["step", "micro-batch"], default="step",
                    help="GNQ over each optimizer step's micro-batches (default) or each micro-batch")
    ap.add_argument("--db", type=Path, help="also ingest the shards into this store at the end")
    args = ap.parse_args()

    with open(args.data, newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))  # a "text" column, and a "group" one if you have groups
    texts, groups = [r["text"] for r in table], [r.get("group") or None for r in table]
    model, encode, pad = model_and_encoder(args.init, args.max_length)
    rows = [{"input_ids": encode(t), "example_id": i} for i, t in enumerate(texts)]
    rows = [r for r in rows if len(r["input_ids"]) > 1]  # a text needs a next token to have a loss

    training = TrainingArguments(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, num_train_epochs=args.epochs, max_steps=args.max_steps,
        learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_steps=10, use_cpu=not torch.cuda.is_available(),
        seed=0, disable_tqdm=True)
    gnq = GNQConfig(out=args.out / "shards", name=args.out.name, lam=args.lam, scope=args.scope,  # GNQ
                    gnq_batch=args.gnq_batch,
                    texts=texts, groups=groups, dataset_path=str(args.data),
                    max_length=args.max_length, db=args.db)
    trainer = GNQTrainer(model=model, args=training, train_dataset=rows,  # GNQ: was Trainer(...)
                         data_collator=lm_collator(pad), gnq=gnq)
    trainer.train()
    if training.process_index == 0:
        scored = trainer.gnq.results.dropna(subset=["gnq"])  # rank 0's score rows, one a text and step
        top = scored.loc[scored["gnq"].idxmax()]
        example = int(top["example_id"])
        print(f"rank 0 scored {len(scored)} example-steps; shards in {gnq.out}"
              + (f", ingested into {args.db}" if args.db else f"; load them: gnq ingest {gnq.out} --db FILE"))
        print(f"highest GNQ on rank 0: {top.gnq:.3g} (example {example}: "
              f"{texts[example][:70]!r})")


if __name__ == "__main__":
    main()
