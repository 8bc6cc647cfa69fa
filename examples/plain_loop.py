"""In-run GNQ in a plain PyTorch training loop: `python examples/plain_loop.py` (no network).
A tiny GPT-2 built from config learns a few texts, their UTF-8 bytes as tokens; every batch's
GNQ comes from the training backward itself (hooks, no extra pass)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core import GNQAuditor, per_example_lm_loss

TEXTS = ["the cat sat on the mat", "rain fell on the quiet town", "she sold sea shells by the shore",
         "my card number is 4111 1111 1111 1111", "the sun rose over the hills", "a dog barked at night"]
PAD = 256  # byte ids are 0..255


def batch_of(texts: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded byte ids; labels -100 on padding (per_example_lm_loss's convention)."""
    ids = [list(t.encode()) for t in texts]
    width = max(map(len, ids))
    input_ids = torch.tensor([x + [PAD] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    return {"input_ids": input_ids, "attention_mask": mask, "labels": input_ids.masked_fill(mask == 0, -100)}


torch.manual_seed(0)
config = GPT2Config(vocab_size=PAD + 1, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                    bos_token_id=PAD, eos_token_id=PAD)
model = GPT2LMHeadModel(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
with GNQAuditor(model, lam=1e-2) as auditor:  # batch="step" for GNQ over accumulation windows
    for epoch in range(3):
        for start in range(0, len(TEXTS), 3):
            batch = batch_of(TEXTS[start:start + 3])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            losses = per_example_lm_loss(logits, batch["labels"])  # each text's own loss
            losses.mean().backward()  # the training backward; the objective's weights are 1/B
            res = auditor.compute(weights=torch.full_like(losses, 1 / len(losses)))
            optimizer.step()
            optimizer.zero_grad()
            print(f"epoch {epoch} texts {start}-{start + 2}: GNQ", [round(g, 3) for g in res.gnq.tolist()])
