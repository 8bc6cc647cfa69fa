"""Sketched per-example gradients (engine/sketch/projection.py): each representation's sketch is the seeded
projection of its explicit gradient; with identity projections the Gram of the sketches is the
exact K; a text's sketch does not depend on its batch; the default sketch stays within the
envelope (Spearman ≥ 0.99, median GNQ relative error ≤ 5%) on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from gnq_core import GNQAuditor
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.representations import DenseFactor, DenseRep, OneHotFactor, OuterRep
from gnq_core.engine.math.solve import gnq_from_kernel
from gnq_core.engine.sketch.projection import Projection, Sketcher, SketchSpec, sketched_gnq, weight_matrices
from tests.conftest import TOL, kernel_err
from tests.lm_fixtures import lm_batch, tiny_gpt2, tiny_llama

SPEARMAN_MIN, MEDIAN_REL_MAX = 0.99, 0.05


def kron_of_explicit(sk: Sketcher, key: str, rep) -> torch.Tensor:
    """Π g_j applied to the materialised gradient (the definition)."""
    return sk.project_explicit(key, rep.materialize())


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", ["blocks", "one-block", "narrow-rows", "narrow-cols", "vocab", "whole"])
def test_outer_sketch_is_the_projection_of_the_gradient(bias, shape):
    B, T = 3, 5
    p0, p1 = {"narrow-rows": (3, 40), "narrow-cols": (40, 3), "whole": (5, 6)}.get(shape, (40, 24))
    block = None if shape == "one-block" else 4
    spec = SketchSpec(k=64, seed=int(torch.randint(0, 999, ())), vocab_rows=16, vocab_cols=4, block=block)
    rep = OuterRep(DenseFactor(torch.randn(B, T, p0)), DenseFactor(torch.randn(B, T, p1)), bias=bias)
    sk = Sketcher(spec, frozenset({"w"} if shape == "vocab" else ()))
    S = sk.sketch("w", rep)
    width = {"vocab": 16 * 4, "whole": p0 * (p1 + bias), "narrow-rows": 3 * (64 // 3),
             "narrow-cols": (64 // (3 + bias)) * (3 + bias)}.get(shape, 64)
    assert S.shape == (B, width)
    assert kernel_err(S, kron_of_explicit(sk, "w", rep)) <= TOL


def test_block_sketch_is_unbiased():
    """E⟨Πg, Πh⟩ = ⟨g, h⟩: the mean over many seeds of the sketched Gram approaches the exact one."""
    gen = torch.Generator().manual_seed(0)  # a statistical check: fixed inputs, 2,000 seeds
    rep = OuterRep(DenseFactor(torch.randn(2, 3, 20, generator=gen)),
                   DenseFactor(torch.randn(2, 3, 20, generator=gen)))
    G = rep.materialize()
    grams = [(lambda S: S @ S.T)(Sketcher(SketchSpec(k=64, block=4, seed=s)).sketch("w", rep))
             for s in range(2000)]
    assert kernel_err(torch.stack(grams).mean(0), G @ G.T) < 0.03


@pytest.mark.parametrize("vocab_rows", [8, 64], ids=["count", "identity"])
@pytest.mark.parametrize("vocab_cols", [None, 8])
def test_embedding_sketch_is_the_projection_of_the_gradient(vocab_cols, vocab_rows):
    """Tokens' rows added into their buckets (CountSketch or identity rows) or a Gaussian's rows
    (an embedding outside the vocabulary set: blocks), against the explicit gradient; repeated
    tokens within a text sum."""
    B, T, V, d = 4, 6, 50, 12
    tokens = torch.randint(0, V, (B, T))
    tokens[:, 1] = tokens[:, 0]
    rep = OuterRep(OneHotFactor(tokens, V), DenseFactor(torch.randn(B, T, d)))
    sk = Sketcher(SketchSpec(k=16, vocab_rows=vocab_rows, vocab_cols=vocab_cols), frozenset({"emb"}))
    S = sk.sketch("emb", rep)
    assert kernel_err(S, kron_of_explicit(sk, "emb", rep)) <= TOL
    other = Sketcher(SketchSpec(k=16, block=2, seed=vocab_rows))  # not vocabulary-sized: Gaussian rows
    assert kernel_err(other.sketch("emb", rep), kron_of_explicit(other, "emb", rep)) <= TOL


def test_dense_sketch_and_narrow_dense_kept_whole():
    sk = Sketcher(SketchSpec(k=16))
    wide, narrow = DenseRep(torch.randn(5, 100)), DenseRep(torch.randn(5, 10))
    assert kernel_err(sk.sketch("wide", wide), kron_of_explicit(sk, "wide", wide)) <= TOL
    assert torch.equal(sk.sketch("narrow", narrow), narrow.G)


def test_same_seed_same_projection_other_seed_not():
    rep = OuterRep(DenseFactor(torch.randn(2, 3, 30)), DenseFactor(torch.randn(2, 3, 30)))
    a = Sketcher(SketchSpec(k=16, seed=3)).sketch("x", rep)
    b = Sketcher(SketchSpec(k=16, seed=3)).sketch("x", rep)
    c = Sketcher(SketchSpec(k=16, seed=4)).sketch("x", rep)
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_folded_sketch_is_a_countsketch_of_the_parameters_sketches():
    """With ``total`` the parameters' sketches are CountSketched, each by its own seeded map,
    into one shared vector: S = Σ_key s_key C_key."""
    spec = SketchSpec(k=32, block=4, total=48, seed=int(torch.randint(0, 999, ())))
    reps = {"a": [OuterRep(DenseFactor(torch.randn(3, 5, 40)), DenseFactor(torch.randn(3, 5, 24)))],
            "b": [DenseRep(torch.randn(3, 30)), DenseRep(torch.randn(3, 30))]}  # a parameter used twice
    sk = Sketcher(spec)
    S = sk.sketch_all(reps)

    def folded(key: str, r) -> torch.Tensor:
        s = sk.sketch(key, r)
        return s @ Projection(s.shape[1], 48, "count", spec.seed, key, "fold").matrix()

    ref = sum(folded(key, r) for key in reps for r in reps[key])
    assert S.shape == (3, 48) and kernel_err(S, ref) <= TOL


def test_folded_sketch_is_unbiased():
    """E⟨Fs, Ft⟩ = ⟨s, t⟩ for the fold F into the shared vector: the mean over many seeds of
    the folded Gram approaches the Gram of the parameters kept whole."""
    gen = torch.Generator().manual_seed(1)
    reps = {"a": [DenseRep(torch.randn(3, 40, generator=gen))],
            "b": [DenseRep(torch.randn(3, 50, generator=gen))]}
    exact = sum(r.G @ r.G.T for rs in reps.values() for r in rs)
    grams = [(lambda S: S @ S.T)(Sketcher(SketchSpec(k=64, total=64, seed=s)).sketch_all(reps))
             for s in range(2000)]
    assert kernel_err(torch.stack(grams).mean(0), exact) < 0.03


def test_columns_budget_sets_the_blocks_per_matrix():
    """``columns`` per side over all n matrices: r = round(columns / (n·b)) blocks, between 1 and
    k / b²; without a count (or columns=None) every matrix gets k / b²."""
    spec = SketchSpec(k=4096, block=8, columns=8192)
    assert [spec.blocks(n) for n in (None, 2, 16, 210, 10**4)] == [64, 64, 64, 5, 1]
    assert SketchSpec(k=4096, block=8, columns=None).blocks(210) == 64
    rep = OuterRep(DenseFactor(torch.randn(2, 3, 100)), DenseFactor(torch.randn(2, 3, 100)))
    sk = Sketcher(SketchSpec(k=4096, block=8, columns=8192, total=None), matrices=210)
    assert sk.sketch("w", rep).shape[1] == 5 * 64
    assert kernel_err(sk.sketch("w", rep), kron_of_explicit(sk, "w", rep)) <= TOL


def test_identity_sized_sketch_stays_side_by_side():
    """A k per matrix above ``total`` (an identity-sized sketch) is not folded: it stays exact."""
    assert SketchSpec(k=10**6).shared is None and SketchSpec().shared == 65536
    assert SketchSpec(total=None).shared is None


def test_shape_change_is_refused():
    sk = Sketcher(SketchSpec(k=16))
    sk.sketch("x", DenseRep(torch.randn(2, 30)))
    with pytest.raises(ValueError, match="another shape"):
        sk.sketch("x", DenseRep(torch.randn(2, 31)))


def audit_sketch(model, batch, spec: SketchSpec, lam: float = 1e-3):
    """(exact K, sketches) of one batch from one pass."""
    with GNQAuditor(model, lam, batch="step", mode="sketch", sketch=spec, keep_exact=True) as auditor:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        per_example_lm_loss(out.logits, batch["labels"]).sum().backward()
        result = auditor.add_micro_batch()
        S = auditor.window_sketches(auditor._window)
        auditor.finish_window()
    return result.kernel, S


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama], ids=["gpt2-tied", "llama"])
def test_identity_sketch_gram_is_exact(build):
    """Every projection the identity (k and buckets ≥ every width): the Gram of the sketches is
    the exact K, so every parameter (tied head, norms, biases, position embeddings) is in the
    sketch exactly once."""
    model = build().double()
    batch = lm_batch([int(n) for n in torch.randint(3, 12, (5,))], seed=int(torch.randint(0, 99, ())))
    K, S = audit_sketch(model, batch, SketchSpec(k=10**6, vocab_rows=10**6))
    assert kernel_err(S @ S.T, K) <= TOL


def test_a_texts_sketch_does_not_depend_on_its_batch():
    model = tiny_gpt2().double()
    batch = lm_batch([7, 5, 9, 6], seed=5)
    spec = SketchSpec(k=16, vocab_rows=64, seed=2)
    _, S = audit_sketch(model, batch, spec)
    swapped = {k: v[[2, 0]] for k, v in batch.items()}
    _, S2 = audit_sketch(model, swapped, spec)
    assert kernel_err(S2, S[[2, 0]]) <= TOL


# ------------------------------------------------------------------ the envelope
def wide_model(family: str, vocab: int = 2048, width: int = 128, layers: int = 2) -> torch.nn.Module:
    """Wide enough that the default sketch projects every matrix side (√k < width); ``layers``
    deep (12: the columns budget leaves 24 blocks per matrix instead of 64)."""
    if family == "gpt2":
        cfg = GPT2Config(vocab_size=vocab, n_positions=32, n_embd=width, n_layer=layers, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(cfg).double()
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg).double()


def random_batch(B: int, T: int, vocab: int) -> dict[str, torch.Tensor]:
    """Random token texts of random lengths, with a few shared phrases so companions matter."""
    ids = torch.randint(0, vocab, (B, T))
    phrases = torch.randint(0, vocab, (3, T))
    which = torch.randint(0, 3, (B,))
    copy = torch.rand(B, T) < 0.5
    ids = torch.where(copy, phrases[which], ids)
    lengths = torch.randint(T // 2, T + 1, (B,))
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = (torch.argsort(torch.argsort(x)).double() for x in (a, b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float(ra @ rb / (ra.norm() * rb.norm()))


def envelope(family: str, specs: list[SketchSpec], B: int = 64, T: int = 16) -> tuple[float, float]:
    """(Spearman, median relative error) of sketched vs exact GNQ on fresh random inputs, each the
    median over ``specs`` (seeds) as in benchmarks/sketch_error.py's table: one pass keeps the
    representations (an exact window of one micro-batch) and every seed sketches them."""
    name, _, depth = family.partition("-")
    model = wide_model(name, layers=12 if depth == "deep" else 2)
    batch = random_batch(B, T, model.config.vocab_size)
    with GNQAuditor(model, 1.0, batch="step", mode="exact") as auditor:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        per_example_lm_loss(out.logits, batch["labels"]).sum().backward()
        K = auditor.add_micro_batch().kernel
        reps, vocab = auditor._window[0].reps, auditor.sketcher.vocab
    lam = 1e-3 * float(K.diagonal().mean())
    exact = gnq_from_kernel(K, lam).gnq
    rhos, rels = [], []
    for spec in specs:
        S = Sketcher(spec, vocab, weight_matrices(model, vocab)).sketch_all(reps)
        approx = sketched_gnq(S, lam).gnq
        rhos.append(spearman(approx, exact))
        rels.append(float(((approx - exact).abs() / exact).median()))
    return float(torch.tensor(rhos).median()), float(torch.tensor(rels).median())


@pytest.mark.parametrize("family", ["gpt2", "llama", "llama-deep"])
def test_default_sketch_within_envelope(family):
    first = int(torch.randint(0, 2**31, ()))
    rho, rel = envelope(family, [SketchSpec(seed=first + i) for i in range(3)])
    assert rho >= SPEARMAN_MIN and rel <= MEDIAN_REL_MAX, (rho, rel)


def test_envelope_check_can_fail():
    """A sketch far too small leaves the envelope: the check above discriminates."""
    rho, rel = envelope("llama", [SketchSpec(k=4, vocab_rows=2, vocab_cols=2, seed=i) for i in range(3)])
    assert rho < SPEARMAN_MIN or rel > MEDIAN_REL_MAX
