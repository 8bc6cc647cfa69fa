"""Prefix-completion extraction attack: batched KV-cache decoding vs a naive reference,
memorised texts are extracted, skipping / threshold / progress semantics, train mode restored."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lm_fixtures import texts, tiny_gpt2, tiny_llama, tokenizer
from tokenizers import Tokenizer, decoders
from transformers import PreTrainedTokenizerFast

from gnq_core.attacks.decode import greedy_decode
from gnq_core.attacks.extraction import ExtractionResult, extraction_attack
from gnq_core.sources.tokens import encode_texts, pad_id


def hf_tokenizer() -> PreTrainedTokenizerFast:
    """The fixtures' BPE tokenizer (a copy, with a byte-level decoder) as a HF fast tokenizer."""
    tok = Tokenizer.from_str(tokenizer().to_str())
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


def scrambled(model: torch.nn.Module, seed: int, scale: float = 0.3) -> torch.nn.Module:
    """Add large random noise to the weights so greedy outputs vary (a fresh init mostly repeats)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def reference_greedy(model: torch.nn.Module, prompt: list[int], n_new: int) -> list[int]:
    """Unbatched, no padding, no cache: the full forward again at every step, then argmax."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


MODELS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def mixed_examples(tok, lengths: list[int]) -> list[list[int]]:
    pool = texts()
    # Three texts per example, so every one is long enough even with the short fallback texts.
    long_texts = [" ".join(pool[(40 + 3 * i + j) % len(pool)] for j in range(3)) for i in range(len(lengths))]
    ids = encode_texts(tok, long_texts, max_length=max(lengths))
    out = [x[:n] for x, n in zip(ids, lengths, strict=True)]
    assert [len(x) for x in out] == lengths
    return out


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_batched_kv_cache_matches_naive_reference(arch):
    torch.manual_seed(3)
    model = scrambled(MODELS[arch]().eval(), seed=4)
    tok = hf_tokenizer()
    p = 5
    lengths = [20, 7, 31, 3, 12, 6, 26, 5, 15, 9]  # 3 and 5 are too short for p = 5
    ids = mixed_examples(tok, lengths)
    example_ids = [100 + 7 * i for i in range(len(ids))]
    results = extraction_attack(model, tok, ids, example_ids, prefix_tokens=p, batch_size=3)

    assert [r.example_id for r in results] == example_ids  # input order despite length sorting
    all_generated = []
    for r, x in zip(results, ids, strict=True):
        if len(x) <= p:
            assert r.match_fraction is None
            continue
        assert r.target_ids == x[p:]
        assert r.n_prefix == p and r.n_continuation == len(x) - p
        assert r.generated_ids == reference_greedy(model, x[:p], len(x) - p)
        hits = sum(g == t for g, t in zip(r.generated_ids, r.target_ids, strict=True))
        assert r.match_fraction == hits / len(x[p:])
        assert r.prefix_text == tok.decode(x[:p]) and r.target_text == tok.decode(x[p:])
        assert r.generated_text == tok.decode(r.generated_ids)
        all_generated += r.generated_ids
    assert len(set(all_generated)) > 10  # the outputs vary, so the comparison is discriminating


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_left_padded_prompts_of_mixed_length_match_reference(arch):
    """greedy_decode with prompts of different lengths (real left padding) vs the reference."""
    torch.manual_seed(5)
    model = scrambled(MODELS[arch]().eval(), seed=6)
    tok = hf_tokenizer()
    prompts = mixed_examples(tok, [9, 1, 14, 4, 11])
    with torch.inference_mode():
        got = greedy_decode(model, prompts, 12, pad_id(tok))
    assert got == [reference_greedy(model, x, 12) for x in prompts]


def test_memorised_texts_are_extracted():
    torch.manual_seed(0)
    tok = hf_tokenizer()
    pool = encode_texts(tok, texts()[:4], max_length=20)
    train, unseen = pool[:3], pool[3]
    assert all(len(x) == 20 for x in pool)
    model = tiny_gpt2(layers=2)
    batch = torch.tensor(train)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        opt.zero_grad()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
    assert loss.item() < 0.05

    results = extraction_attack(model, tok, [*train, unseen], [0, 1, 2, 3], prefix_tokens=4)
    for r in results[:3]:
        assert r.match_fraction == 1.0 and r.success is True
        assert r.generated_ids == r.target_ids and r.n_continuation == 16
    assert results[3].match_fraction < 0.5 and results[3].success is False


class ConstantLM(torch.nn.Module):
    """Always predicts ``token``; ignores the cache."""

    def __init__(self, vocab: int, token: int) -> None:
        super().__init__()
        self.vocab, self.token = vocab, token
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, **kwargs):  # transformers 5's names: `cache`, not `past_key_values`
        logits = torch.zeros(*input_ids.shape, self.vocab)
        logits[..., self.token] = 1.0
        return SimpleNamespace(logits=logits, cache=None)


def test_skipping_threshold_and_progress():
    tok = hf_tokenizer()
    model = ConstantLM(320, token=5)
    ids = [[10, 11, 12, 13, 5, 7, 5, 7],  # match 0.5
           [10, 11],  # too short
           [10, 11, 12, 13],  # exactly p tokens: too short
           [10, 11, 12, 13, 5],  # p + 1: one target token, matched
           [10, 11, 12, 13, 8, 8, 8]]  # no match
    calls: list[int] = []
    res = extraction_attack(model, tok, ids, [0, 1, 2, 3, 4], prefix_tokens=4, threshold=0.5,
                            batch_size=2, progress=calls.append)
    assert sum(calls) == len(ids) and len(calls) == 1 + 2  # skipped ones, then two batches
    assert [r.match_fraction for r in res] == [0.5, None, None, 1.0, 0.0]
    assert [r.success for r in res] == [True, None, None, True, False]
    assert [r.n_continuation for r in res] == [4, 0, 0, 1, 3]
    assert [r.n_prefix for r in res] == [4, 2, 4, 4, 4]
    assert res[1].generated_ids == [] and res[1].target_ids == []
    assert res[1].prefix_text == tok.decode([10, 11])
    assert res[0].generated_ids == [5, 5, 5, 5] and res[4].generated_ids == [5, 5, 5]

    strict = extraction_attack(model, tok, ids[:1], [0], prefix_tokens=4, threshold=0.51)
    assert strict[0].success is False
    assert extraction_attack(model, tok, ids[:1], [0], prefix_tokens=4)[0].success is False  # default 1.0

    capped = extraction_attack(model, tok, ids, [0, 1, 2, 3, 4], prefix_tokens=4, max_new_tokens=2)
    assert [r.n_continuation for r in capped] == [2, 0, 0, 1, 2]
    assert capped[0].target_ids == [5, 7] and capped[0].match_fraction == 0.5

    assert extraction_attack(model, tok, [], [], prefix_tokens=4) == []
    with pytest.raises(ValueError):
        extraction_attack(model, tok, ids, [0], prefix_tokens=4)


def test_suffix_rule_compares_exactly_s_tokens_and_short_texts_are_not_attackable():
    tok = hf_tokenizer()
    model = ConstantLM(320, token=5)
    ids = [[10, 11, 12, 13, 5, 5, 7, 7],  # p + s + 2 tokens: only the first s = 2 count -> extracted
           [10, 11, 12, 13, 5],  # p + 1 < p + s: not attackable (the older rule would call it a success)
           [10, 11, 12, 13, 5, 7]]  # exactly p + s: attacked, half matched
    res = extraction_attack(model, tok, ids, [0, 1, 2], prefix_tokens=4, suffix_tokens=2)
    assert [r.match_fraction for r in res] == [1.0, None, 0.5]
    assert [r.success for r in res] == [True, None, False]
    assert [r.n_continuation for r in res] == [2, 0, 2] and res[0].target_ids == [5, 5]
    with pytest.raises(ValueError):
        extraction_attack(model, tok, ids, [0, 1, 2], prefix_tokens=4, suffix_tokens=0)


def test_training_mode_is_restored():
    tok = hf_tokenizer()
    ids = mixed_examples(tok, [10, 8])
    model = tiny_gpt2(dropout=0.5).train()
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    res = extraction_attack(model, tok, ids, [0, 1], prefix_tokens=4)
    assert seen and not any(seen)  # eval mode (no dropout) during the attack
    assert model.training and all(m.training for m in model.modules())
    assert all(isinstance(r, ExtractionResult) for r in res)

    model.eval()
    extraction_attack(model, tok, ids, [0, 1], prefix_tokens=4)
    assert not any(m.training for m in model.modules())


# ------------------------------------------------------------ the attacks' entrance
def test_forward_batches_follow_the_order_match_one_forward_each_and_restore_train_mode():
    from gnq_core.attacks.forward import forward_batches

    torch.manual_seed(3)
    model = tiny_gpt2()
    model.train()
    ids = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]
    seen = []
    for chunk, batch, logits in forward_batches(model, ids, pad=0, batch_size=2, order=[3, 1, 0]):
        assert not model.training and torch.is_inference_mode_enabled()
        seen.append(chunk)
        for row, i in enumerate(chunk):
            with torch.no_grad():
                alone = model(input_ids=torch.tensor([ids[i]])).logits[0]
            torch.testing.assert_close(logits[row, : len(ids[i])], alone, rtol=1e-4, atol=1e-5)
            assert batch.input_ids[row, : len(ids[i])].tolist() == ids[i]
    assert seen == [[3, 1], [0]] and model.training


def test_run_attacks_runs_and_stores_each_attack_in_order_and_merges_their_counts():
    from gnq_core.attacks.contract import run_attacks

    calls = []

    class Counting:
        def __init__(self, name: str, counts: dict):
            self.name, self.counts = name, counts

        def run(self, target):
            calls.append(("run", self.name, target))
            return self.name.upper()

        def store(self, target, result):
            calls.append(("store", self.name, result))
            return self.counts

    summary = run_attacks([Counting("a", {"x": 1, "y": 2}), Counting("b", {"y": 3})], "T")
    assert summary == {"x": 1, "y": 3} and list(summary) == ["x", "y"]
    assert calls == [("run", "a", "T"), ("store", "a", "A"), ("run", "b", "T"), ("store", "b", "B")]
