"""Grams in one accumulator, norm layers' gradients formed per shape group at compute(),
fused as the default — exact against explicit per-example gradients (float64), and the ops a
step dispatches stay within 1.15× of a plain step."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from conftest import TOL, kernel_err, rel_err
from lm_fixtures import lm_batch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from gnq_core import GNQAuditor, exact_gnq, per_example_lm_loss

V = 40


class MixedNorms(nn.Module):
    """Norm layers of three shape groups (LayerNorm 8 with bias, 8 without, 16), one LayerNorm
    called twice (its parameters are shared: never deferred), an embedding with a padding row
    tied to the head, and Linear layers between them."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 8, padding_idx=0)
        self.ln_a, self.ln_b = nn.LayerNorm(8), nn.LayerNorm(8)
        self.ln_nobias = nn.LayerNorm(8, bias=False)
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)
        self.ln_wide = nn.LayerNorm(16)
        self.twice = nn.LayerNorm(8)
        self.head = nn.Linear(8, V, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.ln_a(self.emb(ids))
        h = h + self.down(torch.tanh(self.ln_wide(self.up(self.ln_b(h)))))
        h = self.twice(self.ln_nobias(h)) + 0.5 * self.twice(h)
        return self.head(h)


def token_losses(model, batch):
    ids, labels = batch
    logits = model(ids)
    return F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100).sum(1)


def padded_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (6, 9), generator=g)
    lengths = torch.tensor([9, 4, 7, 9, 2, 6])
    pad = torch.arange(9)[None] >= lengths[:, None]
    ids = ids.masked_fill(pad, 0)
    return ids, ids.masked_fill(pad, -100)


def audited(model, loss_fn, batch, **kwargs):
    with GNQAuditor(model, lam=1e-3, **kwargs) as auditor:
        loss_fn(model, batch).sum().backward()
        deferred = len(auditor._pass.norms)
        return auditor.compute(), deferred


@pytest.mark.parametrize("budget", [None, 1])
def test_mixed_shape_groups_tied_reused_padding_exact(budget):
    """Deferred (default budget) and immediate (a budget no record fits) norm gradients."""
    torch.manual_seed(281)
    model, batch = MixedNorms(), padded_batch(5)
    kwargs = {} if budget is None else {"memory_budget": budget}
    res, deferred = audited(model, token_losses, batch, **kwargs)
    ref = exact_gnq(model, token_losses, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    assert deferred == (4 if budget is None else 0)  # ln_a, ln_b, ln_nobias, ln_wide; not `twice`
    assert not res.kernel.requires_grad  # the kept activations' graph is not followed at compute()
    paths = res.coverage.paths()
    assert paths["ln_a"] == paths["ln_wide"] == {"fused"}
    assert "tied" in paths["emb"]


def tied_llama():
    cfg = LlamaConfig(vocab_size=320, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return LlamaForCausalLM(cfg)


def lm_losses(model, batch):
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return per_example_lm_loss(out.logits, batch["labels"])


@pytest.mark.parametrize("budget", [None, 1])
def test_llama_rmsnorm_closed_form_tied_padded_exact(budget):
    torch.manual_seed(282)
    model, batch = tied_llama().eval(), lm_batch([10, 6, 10, 3, 8], seed=9)
    kwargs = {} if budget is None else {"memory_budget": budget}
    res, deferred = audited(model, lm_losses, batch, **kwargs)
    ref = exact_gnq(model, lm_losses, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    assert deferred == (5 if budget is None else 0)  # 2 per layer and the final norm
    norms = {e.kernel for e in res.coverage.entries if e.module_type == "LlamaRMSNorm"}
    assert norms == {"rmsnorm"}


def test_fused_is_the_default():
    torch.manual_seed(283)
    model, batch = MixedNorms(), padded_batch(6)
    res, _ = audited(model, token_losses, batch)
    assert "fused" in set().union(*res.coverage.paths().values())


def mlp():
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


@pytest.mark.parametrize("make", [mlp, MixedNorms])
def test_posthoc_backward_with_fused_layers_at_the_input_end(make):
    """auditor.backward under the fused default: a fused first layer is no hooked frontier, so
    its weight is differentiated instead; no param.grad is left, K is exact."""
    torch.manual_seed(285)
    model = make()
    if isinstance(model, MixedNorms):
        batch, loss_fn = padded_batch(7), token_losses
    else:
        batch = (torch.randn(5, 6), torch.randint(0, 3, (5,)))
        loss_fn = lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none")  # noqa: E731
    with GNQAuditor(model, lam=1e-3, path="materialize") as auditor:
        auditor.backward(loss_fn(model, batch).sum())
        res = auditor.compute()
    assert all(p.grad is None for p in model.parameters())
    assert "fused" in set().union(*res.coverage.paths().values())
    ref = exact_gnq(model, loss_fn, batch, 1e-3)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_audited_step_dispatches_at_most_115_percent_of_a_plain_steps_ops(monkeypatch):
    """GPT-2 small's structure (12 blocks, tied head, LayerNorms) at a tiny width and batch:
    forward, backward, compute() and a foreach AdamW step (benchmarks/aten_ops.py: B16 T128).
    The count stands for a GPU's launches, so the CPU-only Gram kernel is off."""
    from gnq_core.engine.math import cpu_gram

    monkeypatch.setattr(cpu_gram, "MAX_THREADS", -1)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(284)
    cfg = GPT2Config(n_layer=12, n_embd=8, n_head=2, vocab_size=32, n_positions=16, bos_token_id=0,
                     eos_token_id=0)
    model = GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, 32, (4, 16))

    def ops(auditor):
        def step():
            per_example_lm_loss(model(input_ids=ids).logits, ids).mean().backward()
            if auditor is not None:
                auditor.compute(weights=torch.full((4,), 1 / 4))
            opt.step()
            opt.zero_grad(set_to_none=True)
        step()
        with _Ops() as counter:
            step()
        return sum(counter.n.values())

    plain = ops(None)
    with GNQAuditor(model, lam=1e-2) as auditor:
        audited_ops = ops(auditor)
    assert audited_ops <= 1.15 * plain, (audited_ops, plain)


def test_ghost_self_grams_from_the_upper_block_triangle_exact(monkeypatch):
    """A large ghost factor Gram with itself (a big-vocabulary head's ΔΔᵀ) is formed from its
    example blocks k ≥ j only and mirrored: the same kernel as the reference, in float64."""
    from gnq_core.engine.math import grams

    used = []
    upper = grams._self_gram_upper

    def spy(f, dtype):
        out = upper(f, dtype)
        used.append(out is not None)
        return out

    monkeypatch.setattr(grams, "SYMMETRIC_GRAM_FLOPS", 0.0)
    monkeypatch.setattr(grams, "_self_gram_upper", spy)
    torch.manual_seed(283)
    model, batch = tied_llama().double().eval(), lm_batch([10, 6, 10, 3, 8], seed=10)
    res, _ = audited(model, lm_losses, batch, path="ghost")
    ref = exact_gnq(model, lm_losses, batch, 1e-3)
    assert any(used)
    assert rel_err(res.gnq, ref.gnq) <= TOL
    assert kernel_err(res.kernel, ref.kernel) <= TOL
    assert torch.equal(res.kernel, res.kernel.T)
