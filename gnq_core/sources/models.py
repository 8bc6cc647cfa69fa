"""Fresh causal LMs and tokenizers, built locally (never from the Hugging Face hub).

`train_tokenizer` trains a byte-level BPE on the given texts with the `tokenizers` library;
`build_model` builds a seeded GPT-2 of a named size preset from config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

# The one special token: beginning/end of text, unknown and padding all at once (as in GPT-2).
# It is the first token the trainer adds, so its id is 0.
SPECIAL_TOKEN = "<|endoftext|>"
SPECIAL_TOKEN_ID = 0

# GPT-2 size presets (every other GPT2Config field keeps its default):
#   "tiny":  n_layer=2, n_embd=64,  n_head=4  (~0.1M parameters plus the embeddings; tests, smoke runs)
#   "small": n_layer=4, n_embd=256, n_head=4  (~3.2M parameters plus the embeddings; CPU-sized experiments)
# Dropout is 0 in both: a model trained without dropout has the same per-example gradients when a
# checkpoint is audited later in eval mode, so in-run and post-hoc GNQ agree.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4},
    "small": {"n_layer": 4, "n_embd": 256, "n_head": 4},
    "gpt2-small": {"n_layer": 12, "n_embd": 768, "n_head": 12},  # GPT-2 small (124M with its 50k vocabulary)
}
_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "summary_first_dropout": 0.0}
_MIN_VOCAB = 257  # the 256 byte symbols plus the special token


def train_tokenizer(texts: Sequence[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `texts`, wrapped for transformers.

    Every byte is in the initial alphabet, so any text round-trips: decode(encode(t)) == t.
    "<|endoftext|>" (id 0) is the bos, eos, unk and pad token; nothing is added around the
    encoded text. Deterministic: the same texts and vocab_size give the same tokenizer.
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not one string")
    if vocab_size < _MIN_VOCAB:
        raise ValueError(f"vocab_size must be at least {_MIN_VOCAB} (256 bytes + {SPECIAL_TOKEN}), "
                         f"got {vocab_size}")
    texts = [str(t) for t in texts]
    if not texts:
        raise ValueError("train_tokenizer needs at least one text")

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert tok.token_to_id(SPECIAL_TOKEN) == SPECIAL_TOKEN_ID

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKEN,
        eos_token=SPECIAL_TOKEN,
        unk_token=SPECIAL_TOKEN,
        pad_token=SPECIAL_TOKEN,
        clean_up_tokenization_spaces=False,
    )


def build_model(preset: str, vocab_size: int, max_length: int, seed: int,
                *, eos_token_id: int = SPECIAL_TOKEN_ID) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 of the named preset (see PRESETS), seeded.

    vocab_size should be len(tokenizer); n_positions is max_length. bos, eos and pad are
    `eos_token_id` (0 for a tokenizer from `train_tokenizer`). The parameters are created in
    torch's default dtype; the same arguments give bitwise identical weights.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if max_length < 1:
        raise ValueError(f"max_length must be positive, got {max_length}")
    if not 0 <= eos_token_id < vocab_size:
        raise ValueError(f"eos_token_id {eos_token_id} is outside the vocabulary (size {vocab_size})")
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_length,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        **_NO_DROPOUT,
        **PRESETS[preset],
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)
