"""Prefix-completion extraction attack: reveal the first p tokens of a training text,
greedy-decode the rest, and measure the fraction of continuation tokens that match.

Token convention as in ``tokens``: each example is its text's tokens without special tokens
(``tokens.encode_texts``).  With ``suffix_tokens = s`` (Carlini et al. 2021/2022's
k-extractability, the rule ``gnq extract`` uses) an example needs at least p + s tokens and its
target is exactly ``tokens[p:p+s]``; a shorter text is "not attackable", never an easy success.
Without it (the studies' older rule) an example needs p + 1 tokens and its target is
``tokens[p:]`` (capped at ``max_new_tokens``).

Calibration (``attacks.run.run_extraction`` with a reference): a text counts as *extracted* only when the
audited checkpoint reproduces its suffix and a reference model (the run's first checkpoint, or
a model the user names, e.g. a fine-tune's base) does not: a continuation any model of the
language produces ("1 2 3 4 5 6") is not a leak. Decoding is greedy and never stops at EOS: each
example generates exactly as many tokens as its target and is compared position by position.

Decoding is ``attacks.generation.generate`` over ``attacks.decode.greedy_decode``, a hand-written
loop (not ``model.generate``), the reference model decoding the same batches:
prompts are left-padded, with an attention mask and explicit position ids from that mask so
padding does not shift positions, and a KV cache feeds one new token per step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from gnq_core.attacks import defaults as attack
from gnq_core.attacks.forward import evaluating, model_device
from gnq_core.attacks.generation import generate
from gnq_core.sources.tokenizer_panics import panics_as_one_line
from gnq_core.sources.tokens import pad_id


@dataclass
class ExtractionResult:
    example_id: int
    n_prefix: int  # p actually used
    n_continuation: int  # number of target tokens compared (0 if the text is too short -> skipped)
    match_fraction: float | None  # fraction of positions i with generated[i] == target[i]; None if skipped
    success: bool | None  # match_fraction >= threshold; None if skipped
    prefix_text: str  # tokenizer.decode of the prefix ids
    generated_text: str  # decode of the generated continuation ids
    target_text: str  # decode of the original continuation ids
    generated_ids: list[int]
    target_ids: list[int]
    reference: ExtractionResult | None = None  # the reference model's result on the same prompt

    @property
    def skipped(self) -> bool:
        return self.match_fraction is None


def extraction_attack(model: torch.nn.Module, tokenizer, token_ids: Sequence[Sequence[int]],
                      example_ids: Sequence[int], *, prefix_tokens: int = 12, threshold: float = 1.0,
                      batch_size: int = 32, max_new_tokens: int | None = None,
                      suffix_tokens: int | None = None,
                      device: torch.device | None = None,
                      progress: Callable[[int], None] | None = None,
                      done: Collection[int] = (),
                      on_batch: Callable[[list[ExtractionResult]], None] | None = None,
                      reference: torch.nn.Module | None = None,
                      starts: Sequence[int | None] | None = None,
                      ) -> list[ExtractionResult]:
    """Run the prefix-completion attack on already-encoded examples; results in input order.
    With a ``reference`` model, each batch is decoded by it too (attacks.generation.generate: the
    same batches) and each attacked result carries its ``reference`` result.

    ``progress(n)`` is called with the number of examples finished by each batch (skipped,
    too-short examples are reported first, in one call), so the calls sum to ``len(token_ids)``.

    Resuming: ``on_batch(results)`` receives each batch's results as soon as they exist (the
    too-short examples first), so a caller can commit them; a later call with the committed
    example ids as ``done`` skips every batch made only of those.  Batches are formed from all
    examples, done or not, so each example is decoded with the same companions (and padding)
    as in an uninterrupted attack.  The results returned are those computed by this call.

    ``starts`` (attacks/windows.py): per text, where its target starts (its prompt: every token
    before it), None when it has no window; without it the target is ``tokens[p:p+s]``.
    """
    if len(token_ids) != len(example_ids):
        raise ValueError(f"{len(token_ids)} token lists but {len(example_ids)} example ids")
    if prefix_tokens < 1:
        raise ValueError("prefix_tokens must be at least 1")
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1 (or None for the whole continuation)")
    if suffix_tokens is not None:
        if suffix_tokens < 1:
            raise ValueError("suffix_tokens must be at least 1")
        max_new_tokens = suffix_tokens
    device = device if device is not None else model_device(model)
    pad = pad_id(tokenizer)

    done = set(done)
    results: list[ExtractionResult | None] = [None] * len(token_ids)
    todo = attackable(token_ids, prefix_tokens, suffix_tokens, starts)
    begin = [prefix_tokens] * len(token_ids) if starts is None else list(starts)
    attacked = set(todo)
    for i, (ids, eid) in enumerate(zip(token_ids, example_ids, strict=True)):
        if i in attacked or int(eid) in done:
            continue
        ids = [int(t) for t in ids]
        at = begin[i]
        prefix = ids[:prefix_tokens if at is None else at]
        results[i] = ExtractionResult(int(eid), len(prefix), 0, None, None, tokenizer.decode(prefix),
                                      "", "", [], [])
    n_skipped = len(token_ids) - len(todo)
    short = [r for r in results if r is not None]
    if on_batch is not None and short:
        on_batch(short)
    if progress is not None and n_skipped:
        progress(n_skipped)

    def target_of(i: int) -> list[int]:
        tgt = [int(t) for t in token_ids[i][begin[i]:]]
        return tgt if max_new_tokens is None else tgt[:max_new_tokens]

    # Longest targets first: similar lengths share a batch, so little generation is wasted.
    todo.sort(key=lambda i: len(target_of(i)), reverse=True)

    models = [model] if reference is None else [model, reference]
    with contextlib.ExitStack() as stack:
        for m in models:
            stack.enter_context(evaluating(m))
        for start in range(0, len(todo), batch_size):
            chunk = todo[start: start + batch_size]
            if all(int(example_ids[i]) in done for i in chunk):
                if progress is not None:
                    progress(len(chunk))
                continue
            prefixes = [[int(t) for t in token_ids[i][:begin[i]]] for i in chunk]
            targets = [target_of(i) for i in chunk]
            generated = generate(models, prefixes, [len(t) for t in targets], pad, batch_size=len(chunk),
                                 device=device, batches=[list(range(len(chunk)))])

            def result(i: int, prefix: list[int], target: list[int], gen: list[int]) -> ExtractionResult:
                match = sum(g == t for g, t in zip(gen, target, strict=True)) / len(target)
                return ExtractionResult(
                    example_id=int(example_ids[i]), n_prefix=len(prefix), n_continuation=len(target),
                    match_fraction=match, success=match >= threshold,
                    prefix_text=tokenizer.decode(prefix), generated_text=tokenizer.decode(gen),
                    target_text=tokenizer.decode(target), generated_ids=gen, target_ids=target)

            for r, (i, prefix, target) in enumerate(zip(chunk, prefixes, targets, strict=True)):
                results[i] = result(i, prefix, target, generated[0][r])
                if reference is not None:
                    results[i].reference = result(i, prefix, target, generated[1][r])
            if on_batch is not None:
                on_batch([results[i] for i in sorted(chunk)])  # type: ignore[misc]
            if progress is not None:
                progress(len(chunk))
    return [r for r in results if r is not None]


def attackable(token_ids: Sequence[Sequence[int]], prefix_tokens: int, suffix_tokens: int | None,
               starts: Sequence[int | None] | None = None) -> list[int]:
    """Indices of the texts the attack decodes: at least p + s tokens (p + 1 without a fixed
    suffix), or, with ``starts`` (attacks/windows.py), a window and s tokens after its start."""
    if starts is None:
        needed = prefix_tokens + (suffix_tokens or 1)
        return [i for i, ids in enumerate(token_ids) if len(ids) >= needed]
    return [i for i, (ids, at) in enumerate(zip(token_ids, starts, strict=True))
            if at is not None and len(ids) >= at + (suffix_tokens or 1)]


@dataclass(frozen=True)
class AttackRule:
    """What "extracted" means for one stored attack (recorded in the run's settings)."""

    prefix_tokens: int = attack.DEFAULT_PREFIX
    suffix_tokens: int | None = attack.DEFAULT_SUFFIX  # None: the rest of the text (the studies' rule)
    threshold: float = attack.DEFAULT_THRESHOLD
    reference: str | None = attack.DEFAULT_REFERENCE  # None: no calibration; else "first" or a model folder

    def describe(self, reference_name: str | None) -> str:
        target = (f"exactly the next {self.suffix_tokens} tokens" if self.suffix_tokens
                  else "the rest of the text")
        match = "all of them" if self.threshold >= 1.0 else f"at least {self.threshold:.0%} of them"
        calibrated = (f", and the reference model ({reference_name}) does not" if reference_name else "")
        needed = self.prefix_tokens + (self.suffix_tokens or 1)
        short = f"; texts shorter than {needed} tokens are not attackable"
        return (f"extracted = given the first {self.prefix_tokens} tokens, greedy decoding reproduces "
                f"{target} ({match}){calibrated}{short}")


def results_frame(tokenizer, results: Sequence[ExtractionResult], threshold: float):
    """Results in the store's layout (one row per example)."""
    import pandas as pd

    return pd.DataFrame({
        "example_id": [r.example_id for r in results],
        "threshold": threshold,
        "n_continuation": [r.n_continuation for r in results],
        "match_fraction": [r.match_fraction for r in results],
        "success": pd.array([r.success for r in results], dtype="boolean"),
        "prefix_text": [r.prefix_text for r in results],
        "generated_text": [r.generated_text for r in results],
        "target_text": [r.target_text for r in results],
        "target_tokens": [_token_strings(tokenizer, r.target_ids) for r in results],
        "generated_tokens": [_token_strings(tokenizer, r.generated_ids) for r in results],
    })


def _token_strings(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (for a token-by-token view of the attack); under one panic
    guard for all of them (the backend's own guard per call would redirect stderr per token)."""
    with panics_as_one_line(getattr(tokenizer, "name_or_path", "") or "the tokenizer",
                            "the tokenizer failed while decoding"):
        return [tokenizer.decode([i]) for i in ids]
