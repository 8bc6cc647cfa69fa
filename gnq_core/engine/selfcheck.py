"""Engine self-check: the auditor against explicit per-example gradients on fresh models.

Run by ``gnq selfcheck`` (and ``make app`` until the dashboard lands).  Each case builds a
small model from config with a fresh random seed, audits one batch in float64 and compares
with ``exact_gnq``, within the bound derived from the case (the Gram's length, the solve's
conditioning: gnq_core.engine.math.tolerance), so an honest difference passes on any CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.reference import exact_gnq
from gnq_core.engine.math.tolerance import exactness


@dataclass
class CheckResult:
    name: str
    batch_size: int
    parameters: int
    rel_error: float  # the largest relative error, kernel or GNQ
    seconds: float
    paths: str
    ok: bool = False  # within the bound derived from the case (gnq_core.engine.math.tolerance)
    detail: str = ""  # the errors and their bounds


def _cases(seed: int) -> Iterator[tuple[str, nn.Module, Callable, object]]:
    g = torch.Generator().manual_seed(seed)

    def ce(model, batch):
        return F.cross_entropy(model(batch[0]), batch[1], reduction="none")

    mlp = nn.Sequential(nn.Linear(100, 40), nn.ReLU(), nn.Linear(40, 10))
    yield "MLP 100-40-10", mlp, ce, (
        torch.randn(32, 100, generator=g), torch.randint(0, 10, (32,), generator=g))

    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, stride=2, groups=4), nn.Flatten(), nn.Linear(8 * 9, 5))
    yield "CNN, groups, GroupNorm", cnn, ce, (
        torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g))

    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    gpt2 = GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(1, 128, (6, 16), generator=g)
    mask = torch.ones_like(ids)
    for j, n in enumerate([16, 11, 7, 16, 4, 13]):
        mask[j, n:] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    def lm(model, b):
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        return per_example_lm_loss(out.logits, b["labels"])

    yield "GPT-2 tiny, tied, padded", gpt2, lm, batch


def run_selfcheck(seed: int | None = None, lam: float = 1e-3) -> list[CheckResult]:
    """Audit each case and compare with the reference; float64 throughout."""
    seed = int(torch.seed() % 2**31) if seed is None else seed
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(seed)
        results = []
        for name, model, loss_fn, batch in _cases(seed):
            start = time.perf_counter()
            with GNQAuditor(model, lam=lam) as auditor:
                loss_fn(model, batch).sum().backward()
                res = auditor.compute()
            seconds = time.perf_counter() - start
            ref = exact_gnq(model, loss_fn, batch, lam)
            n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            judged = exactness(res.kernel, res.gnq, ref.kernel, ref.gnq, lam, n_params)
            paths = sorted(set().union(*res.coverage.paths().values()))
            results.append(CheckResult(name, res.batch_size, res.coverage.covered_numel, judged.error,
                                       seconds, ", ".join(paths), judged.ok, judged.describe()))
        return results
    finally:
        torch.set_default_dtype(previous)
