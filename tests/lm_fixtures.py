"""Tiny causal LMs built from config, and right-padded batches of real text.

No network: the tokenizer is trained here with `tokenizers` on AG News rows from
../shared/data (a few built-in sentences stand in when that folder is absent).
"""

from __future__ import annotations

import csv
import functools
import os
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

# ../shared/data beside the checkout; GNQ_SHARED_DATA names it where the checkout sits elsewhere (a worktree)
SHARED_DATA = Path(os.environ.get("GNQ_SHARED_DATA")
                   or Path(__file__).resolve().parents[1].parent / "shared" / "data")
FALLBACK_TEXTS = [
    "Stocks rallied on Friday after the central bank held interest rates steady.",
    "The new telescope captured images of a galaxy thirteen billion light years away.",
    "Local team wins the championship in overtime thriller.",
    "Researchers report a battery that charges in under five minutes.",
    "Oil prices fell sharply as supply concerns eased.",
    "A rare comet will be visible from the northern hemisphere next week.",
    "Election officials confirmed record turnout in several states.",
    "The museum reopened its ancient history wing after renovation.",
]
PAD_ID = 0


@functools.cache
def texts(n: int = 200) -> tuple[str, ...]:
    path = SHARED_DATA / "ag_news" / "train_2000.csv"
    if not path.exists():
        return tuple(FALLBACK_TEXTS * (n // len(FALLBACK_TEXTS) + 1))[:n]
    with path.open(newline="", encoding="utf-8") as f:
        rows = [f"{title}. {desc}" for _, title, desc in csv.reader(f)]
    return tuple(rows[:n])


@functools.cache
def tokenizer(vocab_size: int = 320) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    return tok


def lm_batch(sizes: list[int], seed: int = 0, vocab_size: int = 320) -> dict[str, torch.Tensor]:
    """A right-padded batch of real texts cut to the given token lengths (variable lengths)."""
    tok = tokenizer(vocab_size)
    gen = torch.Generator().manual_seed(seed)
    pool = texts()
    picks = torch.randperm(len(pool), generator=gen)[: len(sizes)].tolist()
    T = max(sizes)
    ids = torch.full((len(sizes), T), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(sizes), T, dtype=torch.long)
    for row, (i, n) in enumerate(zip(picks, sizes, strict=True)):
        enc = tok.encode(pool[i]).ids[:n]
        ids[row, : len(enc)] = torch.tensor(enc)
        mask[row, : len(enc)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def tiny_gpt2(vocab_size: int = 320, dropout: float = 0.0, layers: int = 2) -> GPT2LMHeadModel:
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=16, n_layer=layers, n_head=2,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     bos_token_id=1, eos_token_id=1)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied embeddings
    return model


def tiny_llama(vocab_size: int = 320) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=PAD_ID,
                      bos_token_id=1, eos_token_id=1)
    model = LlamaForCausalLM(cfg)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    return model
