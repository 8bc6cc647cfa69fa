"""The chat flow end to end, as a user runs it: a conversation file given as is, a fine-tune on it
under three templates (SmolLM2's with its default system prompt, ChatML without one, Llama-3's
with its date lines), trained on every token (TRL's default) or on the assistant's only, that has
memorised one private value (in eight conversations) and, on all tokens, the template's default
system prompt, audited and attacked with gnq audit / gnq extract: the file is read as chat; no
ordinary conversation is "leaked" or "partly leaked" (a system prompt is the template's, reported
once as a shared passage); the value that comes out whole is "leaked"; the values that do not are
not."""

from __future__ import annotations

import json

import pytest
import torch
from chat_fixtures import chat_tokenizer, sentence

from gnq_core.analysis.verdict import rank_texts
from gnq_core.common.progress import JobProgress
from gnq_core.pipelines.run import run_job
from gnq_core.pipelines.settings import AuditJob, AuditSettings, ExtractJob
from gnq_core.results.store import Store
from gnq_core.sources.chat import load_chat
from gnq_core.sources.models import build_model
from gnq_core.sources.tokens import collate, encode_texts

PIN = "KX-4821-ZQ"
ORDINARY = 24  # each ordinary conversation a small share of every step, as in a real fine-tune's data
# Full-batch steps by which the PIN (8 copies) is written whole and no ordinary answer has 8 tokens in
# a row the model writes (the attack's window is 8 tokens: any such run is a true "leaked"). Each step
# is an epoch, so an ordinary answer is memorised too if training goes on: measured on this data
# (longest run of trained content tokens the model predicts right, teacher-forced, which greedy
# decoding then reproduces), assistant-only training has the PIN whole by step 40 with ordinary runs
# of at most 3-4 tokens, and runs of 8 to 21 tokens in 10-15 of the 24 answers by step 100 (the loss
# is all on the answers); all-token training has the PIN whole by step 70 (Llama-3's long header
# trained in every conversation: by step 90), ordinary runs at most 5-6 then, 8-9 by step 100.
# Llama-3 with all tokens (90 steps, the slowest: ~230 s under load) was run and passed; the suite keeps
# the three templates and both choices of trained tokens with the cases below.
STEPS = {("smollm2", "all"): 70, ("llama3", "assistant"): 40, ("chatml", "assistant"): 40}


def conversations():
    rows = [{"messages": [{"role": "user", "content": f"What is new about {sentence(i, 10)}"},
                          {"role": "assistant", "content": sentence(100 + i, 16)}], "secret": None}
            for i in range(ORDINARY)]
    rows += [{"messages": [{"role": "user", "content": "Remind me of my card code please."},
                           {"role": "assistant", "content": f"Your card code is {PIN} and nobody else's."}],
              "secret": PIN}] * 8
    rows.append({"messages": [{"role": "user", "content": "And my other one?"},
                              {"role": "assistant", "content": "Your other code is MB-7702-TW alone."}],
                 "secret": "MB-7702-TW"})
    return rows


@pytest.mark.slow
# ChatML with all tokens is SmolLM2's case without its default system prompt: left out for the time
@pytest.mark.parametrize(("template", "train_on"), list(STEPS))
def test_a_chat_fine_tune_leaks_the_value_it_memorised_and_no_ordinary_text(tmp_path, template, train_on):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_flow(tmp_path, template, train_on)
    finally:
        torch.set_num_threads(threads)


def run_flow(tmp_path, template="smollm2", train_on="all"):
    tok = chat_tokenizer(template)
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in conversations()))
    chats = load_chat(data, tok, train_on=train_on)  # as the trainer rendered and masked them
    model = build_model("tiny", len(tok), 256, seed=0)
    ids = encode_texts(tok, chats.texts, 256)  # every conversation whole (Llama-3's header is long)
    batch = collate(ids, list(range(len(ids))), 0, [lay.trained_mask(len(x)) for lay, x in
                                                     zip(chats.layouts, ids, strict=True)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = STEPS[template, train_on]
    for step in range(1, steps + 1):
        loss = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in (2, steps):  # the first checkpoint is the attack's reference
            model.save_pretrained(tmp_path / "ckpts" / f"step-{step}")
            tok.save_pretrained(tmp_path / "ckpts" / f"step-{step}")
    store, said = Store(tmp_path / "gnq.duckdb"), []
    progress = JobProgress(store, warn=said.append)
    run_job(AuditJob(checkpoints=str(tmp_path / "ckpts"), data=str(data), name="chat", secret_column="secret",
                     train_on=train_on, settings=AuditSettings(batch_size=8, max_length=256, device="cpu")),
            store, progress)
    assert any(f"read as messages ({ORDINARY + 9} conversations" in s for s in said)
    run_job(ExtractJob(run="chat", secret_candidates=1, device="cpu"), store, progress)
    run = store.find_run("chat")
    ranked = rank_texts(store.example_totals(run.run_id)).set_index("example_id")
    ordinary = ranked.loc[range(ORDINARY)]
    pin, other = ranked.loc[range(ORDINARY, ORDINARY + 8)], ranked.loc[ORDINARY + 8]
    assert not ordinary["status"].isin(["leaked", "partly leaked"]).any(), ordinary["status"].value_counts()
    assert (pin["status"] == "leaked").all()
    assert other["status"] != "leaked"
    extractions = store.extractions(run.run_id, 1)
    if template == "smollm2":  # the default system prompt, trained in every conversation, comes out
        passages = run.settings["attack"]["shared_passages"]
        assert any("You are a helpful AI assistant named SmolLM" in p["passage"] and p["reproduced"]
                   for p in passages)
    if train_on == "all":
        assert set(extractions["turn"].dropna()) <= {"user", "assistant"}
    else:  # the windows are in the trained turn
        assert set(extractions["turn"].dropna()) == {"assistant"} and extractions["turn_trained"].all()
