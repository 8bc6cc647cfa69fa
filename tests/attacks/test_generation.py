"""The attacks' generation engine (pipelines/attacks/generation.py) gives what the per-prompt path
gives: batched, length-bucketed greedy decoding with left padding the same tokens as decoding each
prompt alone by recomputing its whole forward at every step, and a value's exposure the same
rank, nodes and bits with the prompt's scorer shared by many values as with one scorer per value
that forwards every path.

In float64 (the suite's default dtype): greedy decoding is deterministic, but in float32 a batch's
padding changes the last bits of the logits and can flip a near-tie between two tokens, and fresh
random tiny models are full of near-ties.
"""

from __future__ import annotations

import random

import pytest
import torch

from gnq_core.attacks.exposure import PromptScorer, Scorers, ValueSpace, exposure, value_space
from gnq_core.attacks.extraction import extraction_attack
from gnq_core.attacks.generation import generate, last_logprobs, plan_batches
from gnq_core.sources.models import build_model, train_tokenizer

TEXTS = [f"Note for {n}: the door PIN is {random.Random(i).randrange(10_000):04d}, keep it safe."
         for i, n in enumerate(["Anna Berg", "Tom Okafor", "Lena Novak", "Ravi Menon", "Ines Duarte"] * 40)]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, 400)


def _alone(model, prompt: list[int], n_new: int) -> list[int]:
    """The per-prompt path: the prompt alone, its whole forward recomputed at every step."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n_new):
            x = torch.tensor([ids])
            out = model(input_ids=x, attention_mask=torch.ones_like(x))
            ids.append(int(out.logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_greedy_equals_each_prompt_decoded_alone(tok, seed):
    """Fresh random tiny models (nearly flat logits: near-ties everywhere), prompts of many lengths
    and generation lengths, two models on the same batches, batches of 3."""
    assert torch.get_default_dtype() == torch.float64
    models = [build_model("tiny", len(tok), 64, seed=seed + k).eval() for k in (0, 10)]
    rng = random.Random(seed)
    prompts = [rng.choices(range(len(tok)), k=rng.randint(1, 12)) for _ in range(11)]
    n_new = [rng.randint(1, 6) for _ in prompts]
    seen: list[list[int]] = []
    with torch.inference_mode():
        got = generate(models, prompts, n_new, 0, batch_size=3, on_batch=lambda chunk, _: seen.append(chunk))
    for m, model in enumerate(models):
        assert got[m] == [_alone(model, p, n) for p, n in zip(prompts, n_new, strict=True)]
    assert sorted(i for chunk in seen for i in chunk) == list(range(len(prompts)))
    assert all(len({n_new[i] for i in chunk}) == 1 and len(chunk) <= 3 for chunk in seen)


def test_batches_are_bucketed_by_generation_length_and_sorted_by_prompt_length():
    prompts = [[1] * n for n in (3, 9, 5, 7, 2, 8)]
    batches = plan_batches(prompts, [4, 4, 8, 4, 8, 4], 2)
    assert batches == [[2, 4], [1, 5], [3, 0]]
    with pytest.raises(ValueError):
        plan_batches(prompts, [1] * 6, 0)


def test_the_text_attack_with_a_reference_equals_two_separate_attacks(tok):
    model, reference = (build_model("tiny", len(tok), 64, seed=s).eval() for s in (3, 4))
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS[:9]]
    kwargs = dict(prefix_tokens=4, suffix_tokens=5, batch_size=4)
    both = extraction_attack(model, tok, ids, list(range(9)), reference=reference, **kwargs)
    alone = extraction_attack(model, tok, ids, list(range(9)), **kwargs)
    ref = extraction_attack(reference, tok, ids, list(range(9)), **kwargs)
    assert [r.generated_ids for r in both] == [r.generated_ids for r in alone]
    assert [r.reference.generated_ids for r in both] == [r.generated_ids for r in ref]
    assert [r.reference.match_fraction for r in both] == [r.match_fraction for r in ref]


def test_last_position_logprobs_equal_the_full_right_padded_forward(tok):
    model = build_model("tiny", len(tok), 64, seed=5).eval()
    prompt = tok("Note for Anna Berg: the door PIN is", add_special_tokens=False)["input_ids"]
    scorer = PromptScorer(model, prompt, 8)
    paths = [[5], [7, 8, 9, 10], [11, 12]]
    logp, lengths = scorer._forward(paths)
    full = logp[torch.arange(len(paths)), lengths - 1]
    assert torch.allclose(last_logprobs(scorer, paths), full, rtol=0, atol=1e-12)


class _EveryPath(PromptScorer):
    """The per-value path: every path forwarded (right-padded, every position's logits), nothing
    kept between calls or values."""

    def next_logprobs(self, paths, keep=None):
        rows = super().next_logprobs(paths)
        return rows if keep is None else rows[:, keep]


def test_a_shared_scorer_gives_every_value_the_exposure_a_scorer_of_its_own_gives(tok, monkeypatch):
    """The never-trained values of a format after one prompt (as the null scores them): the same
    rank, nodes and bits, while the shared scorer forwards far fewer paths for the later values."""
    import gnq_core.attacks.exposure as exposure_module

    model = build_model("tiny", len(tok), 64, seed=6).eval()
    prompt = tok("Note for Anna Berg: the door PIN is", add_special_tokens=False)["input_ids"]
    space = value_space("4821", "pin", {0})  # 1,000 values: the search can finish on a flat model
    rng = random.Random(0)
    values = [space.random(rng) for _ in range(4)]
    forwarded: list[int] = []
    real = exposure_module.last_logprobs
    monkeypatch.setattr(exposure_module, "last_logprobs",
                        lambda scorer, paths: forwarded.append(len(paths)) or real(scorer, paths))
    scorers = Scorers(batch_size=16)
    per_value, methods = [], set()
    with torch.inference_mode():
        for budget in (20, 3000):  # the estimate (search stopped), the exact rank
            for v in values:
                one = ValueSpace(v, space.free, space.check)
                kw = dict(budget=budget, n_candidates=32, seed=1, batch_size=16)
                alone = exposure(model, tok, prompt, " ", one, scorer=_EveryPath(model, prompt, 16), **kw)
                before = sum(forwarded)
                shared = exposure(model, tok, prompt, " ", one, scorer=scorers(model, prompt), **kw)
                per_value.append(sum(forwarded) - before)
                methods.add(shared.method)
                assert (shared.method, shared.rank, shared.nodes, shared.candidates) == (
                    alone.method, alone.rank, alone.nodes, alone.candidates)
                assert shared.bits == pytest.approx(alone.bits, rel=1e-12, abs=1e-12)
    assert methods == {"exact", "estimated"}  # both ends of the search compared
    assert per_value[0] > 0 and sum(per_value[1:4]) < per_value[0]  # the later values reuse the tree


def test_a_formats_random_values_are_scored_once_per_prompt_and_exclude_the_value(tok, monkeypatch):
    """Every value of one format after one prompt is compared with one random sample of the format
    (drawn from the seed, not the value): scored once, each value's own entry left out, and its
    estimate what the old per-value draw would compute from that same sample."""
    from gnq_core.attacks import exposure as exposure_module

    model = build_model("tiny", len(tok), 64, seed=7).eval()
    prompt = tok("Note for Tom Okafor: the door PIN is", add_special_tokens=False)["input_ids"]
    space = value_space("4821", "pin", set())  # 10,000 values
    scorer = PromptScorer(model, prompt, 16)
    scored: list[int] = []
    real = PromptScorer.cumulative
    monkeypatch.setattr(PromptScorer, "cumulative",
                        lambda self, paths: scored.append(len(paths)) or real(self, paths))
    rng = random.Random(5)
    values = [space.random(rng) for _ in range(3)]
    with torch.inference_mode():
        samples = [exposure_module._sample(scorer, tok, ValueSpace(v, space.free), " ", 40, seed=9)[:2]
                   for v in values]
        sample = next(iter(scorer.samples.values()))
        drawn, all_scores = sample.values, sample.scores
        inside = drawn[3]  # a value that is in the sample: its own entry is the one left out
        true_in, others_in, _ = exposure_module._sample(scorer, tok, ValueSpace(inside, space.free), " ", 40,
                                                        seed=9)
    assert scored == [40, 1, 1, 1, 1]  # the sample once, then each value's own score
    assert len(scorer.samples) == 1 and len(drawn) == len(set(drawn)) == 40
    for _, others in samples:
        assert len(others) == 39 and (others == all_scores[:39]).all()
    assert true_in == pytest.approx(all_scores[3], rel=1e-12) and len(others_in) == 39
    assert (others_in == all_scores[[i for i in range(40) if i != 3]]).all()
    # another seed or another text between prompt and value: a sample of its own
    with torch.inference_mode():
        exposure_module._sample(scorer, tok, ValueSpace(values[0], space.free), " ", 40, seed=10)
    assert len(scorer.samples) == 2
