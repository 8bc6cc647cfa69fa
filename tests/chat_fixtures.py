"""Local tokenizers with chat templates (trained here, never downloaded) and conversations in
each format TRL reads, for the chat tests."""

from __future__ import annotations

import random

from lm_fixtures import texts

from gnq_core.sources.models import train_tokenizer

CHAT_TOKENS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|eot_id|>"]

# SmolLM2-Instruct's template: a default system prompt when the conversation has none
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face' }}"
           "{{ '<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# ChatML without a default system prompt, with {% generation %} around the assistant's turns
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
          "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
          "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Llama-3's shape: BOS, a system header with a knowledge and a date line, trimmed contents
LLAMA3 = ("{{ bos_token }}{% set system = messages[0]['content'] | trim if messages[0]['role'] == 'system' "
          "else '' %}"
          "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
          "Today Date: 26 Jul 2024\n\n{{ system }}<|eot_id|>"
          "{% for message in messages %}{% if message['role'] != 'system' %}"
          "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
          "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] | trim }}<|eot_id|>"
          "{% endgeneration %}{% else %}{{ message['content'] | trim }}<|eot_id|>{% endif %}{% endif %}"
          "{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
TEMPLATES = {"smollm2": SMOLLM2, "chatml": CHATML, "llama3": LLAMA3}


def chat_tokenizer(template: str, vocab_size: int = 400):
    """A byte-level BPE trained on AG News rows, with the chat control tokens and ``template``."""
    tok = train_tokenizer(list(texts(120)), vocab_size=vocab_size)
    tok.add_tokens(CHAT_TOKENS, special_tokens=True)
    tok.chat_template = TEMPLATES.get(template, template)
    return tok


def sentence(seed: int, words: int = 10) -> str:
    """A seeded sentence of AG News words: distinct texts for any number of conversations."""
    vocab = sorted({w.strip(".,").lower() for t in texts(40) for w in t.split() if w.isalpha()})
    rng = random.Random(seed)
    return " ".join(rng.choice(vocab) for _ in range(words)).capitalize() + "."


def conversations(n: int = 6) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Question {i}: what happened? {sentence(2 * i, 6)}"},
             {"role": "assistant", "content": sentence(2 * i + 1)}] for i in range(n)]


def records(fmt: str, n: int = 6, system: str | None = None) -> list[dict]:
    """``n`` records in format ``fmt`` (messages, sharegpt, prompt-completion, prompt-completion-text,
    alpaca), the same questions and answers in each."""
    convs = conversations(n)
    if system is not None:
        convs = [[{"role": "system", "content": system}, *c] for c in convs]
    if fmt == "messages":
        return [{"messages": c} for c in convs]
    if fmt == "sharegpt":
        return [{"conversations": [{"from": m["role"], "value": m["content"]} for m in c]} for c in convs]
    if fmt == "prompt-completion":
        return [{"prompt": c[:-1], "completion": c[-1:]} for c in convs]
    if fmt == "prompt-completion-text":
        return [{"prompt": c[-2]["content"] + "\n", "completion": c[-1]["content"]} for c in convs]
    if fmt == "alpaca":
        return [{"instruction": c[-2]["content"], "input": "", "output": c[-1]["content"]} for c in convs]
    raise ValueError(fmt)
