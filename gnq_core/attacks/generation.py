"""The attacks' one generation engine: every greedy continuation (text windows, secret values) and
every prompt's next-token scoring (the exposure search) goes through here.

* ``plan_batches``: prompts grouped by how many tokens they generate, sorted by length within a
  group (little left padding), cut into batches; ``generate`` decodes each batch with every model
  in turn (the audited checkpoint, then the reference on the same batch), through
  ``decode.greedy_decode`` (left padding, an attention mask, explicit positions, the model's own
  cache passed as ``cache`` where transformers names it so).  Greedy decoding is deterministic: a
  prompt gets the same tokens batched as alone, exactly in float64; in float32 a batch's padding
  changes the last bits of the logits and may flip a near-tie (tests/attacks/test_generation.py).
* The exposure search's scorers (``exposure.PromptScorer``, kept per (model, prompt) by
  ``exposure.Scorers``) compute their next-token rows here: a value's copies and the never-trained
  values of its format reuse the prompt's KV cache and the rows its search already computed.
* ``last_logprobs``: the next-token log-probabilities after each of several paths behind one
  prompt's cache, the paths left-padded so only the last position's logits are computed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gnq_core.attacks.decode import forward_parameters, greedy_decode

__all__ = ["generate", "last_logprobs", "plan_batches"]


def plan_batches(prompts: Sequence[Sequence[int]], n_new: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``prompts`` in batches of at most ``batch_size``: one ``n_new`` per batch (a
    prompt never decodes past what it asked for), longest prompts first within it."""
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(n_new):
        groups.setdefault(int(n), []).append(i)
    out = []
    for n in sorted(groups, reverse=True):
        idx = sorted(groups[n], key=lambda i: -len(prompts[i]))  # stable: equal lengths keep their order
        out += [idx[s: s + batch_size] for s in range(0, len(idx), batch_size)]
    return out


def generate(models: Sequence[torch.nn.Module], prompts: Sequence[Sequence[int]], n_new: Sequence[int],
             pad: int, *, batch_size: int, device: torch.device | None = None,
             batches: list[list[int]] | None = None,
             on_batch: Callable[[list[int], list[list[list[int]]]], None] | None = None,
             ) -> list[list[list[int]]]:
    """Greedy continuations: ``out[m][i]`` is ``n_new[i]`` tokens after ``prompts[i]`` under
    ``models[m]``.  Each batch (``plan_batches``, or ``batches``) is decoded by every model in
    turn, then ``on_batch(indices, [per model, its rows])`` is called.  Call with the models in
    eval mode under ``torch.inference_mode`` (``forward.evaluating``)."""
    out: list[list[list[int]]] = [[[] for _ in prompts] for _ in models]
    for chunk in (batches if batches is not None else plan_batches(prompts, n_new, batch_size)):
        width = max(int(n_new[i]) for i in chunk)
        asked = [prompts[i] for i in chunk]
        got = [[g[: int(n_new[i])] for i, g in zip(chunk, greedy_decode(m, asked, width, pad, device),
                                                    strict=True)] for m in models]
        for m, rows in enumerate(got):
            for i, row in zip(chunk, rows, strict=True):
                out[m][i] = row
        if on_batch is not None:
            on_batch(chunk, got)
    return out


def last_logprobs(scorer: Any, paths: Sequence[Sequence[int]]) -> torch.Tensor:
    """log p(next token | prompt, path) in float64, (len(paths), vocab), for non-empty ``paths``
    behind ``scorer``'s prompt cache (an ``exposure.PromptScorer``).  The paths are left-padded
    after the prompt (a masked gap, positions counted over real tokens only), so every row ends at
    the last column and only that column's logits are computed; a model whose forward takes no
    positions is run right-padded and its last real position read."""
    model, n = scorer.model, len(paths)
    params = forward_parameters(model)
    if "position_ids" not in params:
        logp, lengths = scorer._forward(paths)
        return logp[torch.arange(n), lengths - 1]
    width, context = max(len(p) for p in paths), scorer.context
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, context + width), dtype=torch.long)
    mask[:, :context] = 1
    positions = torch.zeros((n, width), dtype=torch.long)
    for r, p in enumerate(paths):
        gap = width - len(p)
        ids[r, gap:] = torch.tensor(list(p), dtype=torch.long)
        mask[r, context + gap:] = 1
        positions[r, gap:] = torch.arange(context, context + len(p))
    cache = copy.deepcopy(scorer.cache)  # a forward extends the cache it is given
    cache.batch_repeat_interleave(n)
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    dev = scorer.device
    with torch.inference_mode():
        out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                    use_cache=True, **{scorer.cache_name: cache}, **extra)
    return torch.log_softmax(out.logits[:, -1].double(), dim=-1)
