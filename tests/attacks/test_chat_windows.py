"""Attacks on what was trained, never on the template or the data set's boilerplate
(attacks/windows.py, sources/boilerplate.py): on a tiny GPT-2 that has memorised a legal prefix
every text shares, the old rule's windows (tokens[p:p+s]) are "reproduced" for every text, the
content windows lie after the prefix, in each text's own words; chat windows lie inside one
message's content, prompted with the conversation up to there, naming their turn."""

from __future__ import annotations

import pytest
import torch
from chat_fixtures import chat_tokenizer, records, sentence

from gnq_core.attacks.extraction import extraction_attack
from gnq_core.attacks.windows import content_windows
from gnq_core.sources.boilerplate import boilerplate_spans, common_prefix, own_contents
from gnq_core.sources.chat import example_of, render_example
from gnq_core.sources.models import build_model, train_tokenizer
from gnq_core.sources.tokens import collate, encode_texts

LEGAL = "Confidential: this message is for the named recipient only and may not be shared. "
P, S = 6, 6


def memorised(tok, texts, steps=150):
    """A tiny GPT-2 trained from scratch on ``texts`` (whole batch, Adam) until it knows them."""
    model = build_model("tiny", len(tok), 64, seed=0)
    ids = encode_texts(tok, texts, 64)
    batch = collate(ids, list(range(len(ids))), 0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), ids


@pytest.fixture(autouse=True)
def one_thread():
    """A model this small trains 15x faster on one thread than on two of a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_shared_legal_prefix_is_boilerplate_and_no_window_falls_in_it():
    texts = [LEGAL + sentence(i, 12) for i in range(16)]
    tok = train_tokenizer(texts, vocab_size=300)
    model, ids = memorised(tok, texts, steps=60)
    assert common_prefix(texts).startswith(LEGAL.strip())
    # the old rule's target lies in the prefix the model has memorised: "reproduced" for every text
    old = extraction_attack(model, tok, ids, list(range(len(ids))), prefix_tokens=P, suffix_tokens=S)
    assert all(r.success for r in old) and all(r.target_text in LEGAL for r in old)
    windows = content_windows(tok, texts, None, ids, P, S)
    prefix_tokens = len(tok(LEGAL.strip(), add_special_tokens=False)["input_ids"])
    assert all(w is not None and w.start >= prefix_tokens for w in windows)
    new = extraction_attack(model, tok, ids, list(range(len(ids))), prefix_tokens=P, suffix_tokens=S,
                            starts=[w.start for w in windows])
    assert all(r.target_text not in LEGAL and r.prefix_text.startswith(LEGAL.strip()[:20]) for r in new)
    # copy detection compares the texts' own words: no cluster of 16 "copies" of the legal text
    assert all(LEGAL.strip() not in c for c in own_contents(texts))


def test_a_line_most_texts_repeat_and_a_whole_copy_are_told_apart():
    footer = "Acme Ltd, 1 Main Street, Springfield. Registered in England no. 0000000."
    texts = [f"{sentence(i)}\n{footer}\n{sentence(100 + i)}" for i in range(6)] + ["short one"]
    spans = boilerplate_spans(texts)
    assert all(texts[i][s:e] == footer for i in range(6) for s, e in spans[i])
    assert spans[6] == []
    copies = [sentence(1)] * 4 + [sentence(2)]  # a text most others copy is a copy, not boilerplate
    assert boilerplate_spans(copies)[0] == []


@pytest.mark.parametrize("template", ["smollm2", "chatml", "llama3"])
@pytest.mark.parametrize("train_on", ["all", "assistant"])
def test_chat_windows_are_inside_one_message_and_name_their_turn(template, train_on):
    tok = chat_tokenizer(template)
    if train_on == "assistant" and template == "smollm2":
        pytest.skip("TRL has no training template for it: refused (test_chat_data)")
    rows = records("messages", 8, system="You are the support assistant of Acme Bank, always polite.")
    rendered = [render_example(tok, example_of(r, "messages", "x", i), train_on) for i, r in enumerate(rows)]
    texts, layouts = [r.text for r in rendered], [r.layout.to_json() for r in rendered]
    ids = [r.ids for r in rendered]
    windows = content_windows(tok, texts, layouts, ids, P, S)
    for r, w in zip(rendered, windows, strict=True):
        assert w is not None
        turn = next(t for t in r.layout.turns if t.kind == w.turn)
        target = tok.decode(r.ids[w.start: w.start + S])
        assert target in r.text[turn.start: turn.end]  # inside one message's own content
        assert w.trained and (train_on == "all" or w.turn == "assistant")  # a trained turn first
        prompt = tok.decode(r.ids[: w.start])
        header = "<|end_header_id|>" if template == "llama3" else f"<|im_start|>{turn.role}"
        assert header in prompt  # prompted with the conversation up to there, the turn's header included
        # the system prompt every conversation shares is never a window
        assert "Acme Bank" not in target
