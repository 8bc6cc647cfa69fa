"""Fine-tune a small causal LM with the Hugging Face Trainer and GNQ over every optimizer step.

    python examples/finetune_with_gnq.py                                   # one process
    python -m torch.distributed.run --nproc_per_node 2 examples/finetune_with_gnq.py   # B_eff: 8 × 2 × 2
    gnq ingest runs/finetune-gnq/shards --db data/gnq.duckdb               # then the dashboard

No network: the tokenizer is trained here on the texts, the model is a tiny GPT-2 built from
config (standing in for the checkpoint you would fine-tune; pass --init DIR to start from a saved
Hugging Face checkpoint folder instead).  Each rank writes its own Parquet shards; nothing
waits on the database while training.  The only GNQ-specific lines are marked # GNQ.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import TrainingArguments

from gnq_core.integrations.hf import GNQConfig, GNQTrainer, lm_collator  # GNQ
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import load_texts
from gnq_core.sources.models import build_model, train_tokenizer
from gnq_core.sources.tokens import encode_texts, pad_id

ROOT = Path(__file__).resolve().parents[1]


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

    data = load_texts(args.data)
    if args.init is not None:
        model, tokenizer = load_checkpoint(args.init)
    else:
        tokenizer = train_tokenizer(data.texts, vocab_size=512)
        model = build_model("tiny", vocab_size=len(tokenizer), max_length=args.max_length, seed=0,
                            eos_token_id=tokenizer.eos_token_id)
    ids = encode_texts(tokenizer, data.texts, args.max_length)
    rows = [{"input_ids": x, "example_id": i} for i, x in enumerate(ids) if len(x) > 1]

    training = TrainingArguments(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum, num_train_epochs=args.epochs, max_steps=args.max_steps,
        learning_rate=1e-3,
        report_to=[], save_strategy="no", logging_steps=10, use_cpu=not torch.cuda.is_available(),
        seed=0, disable_tqdm=True)
    gnq = GNQConfig(out=args.out / "shards", name=args.out.name, lam=args.lam, scope=args.scope,  # GNQ
                    gnq_batch=args.gnq_batch,
                    texts=data.texts, groups=data.groups, dataset_path=str(data.path),
                    max_length=args.max_length, db=args.db)
    trainer = GNQTrainer(model=model, args=training, train_dataset=rows,  # GNQ: was Trainer(...)
                         data_collator=lm_collator(pad_id(tokenizer)), gnq=gnq)
    trainer.train()
    if training.process_index == 0:
        scored = trainer.gnq.results.dropna(subset=["gnq"])  # rank 0's score rows, one a text and step
        top = scored.loc[scored["gnq"].idxmax()]
        example = int(top["example_id"])
        print(f"rank 0 scored {len(scored)} example-steps; shards in {gnq.out}"
              + (f", ingested into {args.db}" if args.db else f"; load them: gnq ingest {gnq.out} --db FILE"))
        print(f"highest GNQ on rank 0: {top.gnq:.3g} (example {example}: "
              f"{data.texts[example][:70]!r})")


if __name__ == "__main__":
    main()
