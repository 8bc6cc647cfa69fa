"""Numerics: a batch whose loss or gradients are NaN/Inf is marked non-finite in the store (NULL
GNQ) and the job goes on, in `gnq audit` and `gnq train` (where the optimizer skips it, so the
model is not poisoned); a singular kernel (duplicated texts) is solved exactly by the Cholesky
solve with its condition number recorded, not clamped."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hostile_helpers import gnq, make_series
from lm_fixtures import texts
from transformers import GPT2Config, GPT2LMHeadModel

from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.models import train_tokenizer

pytestmark = pytest.mark.slow
MARK = "§"  # the only non-ASCII character of the dataset: its input embedding is NaN


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory) -> tuple[Path, Path, list[int]]:
    """An untied GPT-2 whose input embedding of MARK's tokens is NaN, and 12 texts, one with MARK."""
    root = tmp_path_factory.mktemp("nan")
    ascii_texts = [t for t in texts(200) if t.isascii()][:11]
    rows = ascii_texts[:5] + [f"A text with a {MARK} sign in it, for the poisoned batch."] + ascii_texts[5:]
    tok = train_tokenizer(rows + list(texts(200)), vocab_size=300)
    config = GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2,
                        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    bad = tok.encode(MARK)
    assert all(i not in bad for t in ascii_texts for i in tok.encode(t))
    with torch.no_grad():
        model.transformer.wte.weight[bad] = float("nan")
    save_checkpoint(model, tok, root / "ckpt")
    data = root / "texts.txt"
    data.write_text("\n".join(rows) + "\n")
    return root / "ckpt", data, bad


def check_marked(store: Store, name: str) -> None:
    run = store.run(name)
    assert run.status == "done"
    batches, scores = store.batches(run.run_id), store.scores(run.run_id)
    marked = 5  # example id of the text with MARK
    for point, per_point in batches.groupby("point"):
        bad = scores[(scores["point"] == point) & (scores["example_id"] == marked)]["batch_index"].item()
        assert list(per_point.loc[~per_point["finite"], "batch_index"]) == [bad], per_point
        assert per_point.loc[~per_point["finite"], "condition"].isna().all()
        assert (per_point.loc[per_point["finite"], "condition"] >= 1).all()
        s = scores[scores["point"] == point]
        in_bad = s["batch_index"] == bad
        assert s.loc[in_bad, "gnq"].isna().all() and s.loc[in_bad, "self_influence"].isna().all()
        assert s.loc[~in_bad, "gnq"].notna().all() and (s.loc[~in_bad, "gnq"] > 0).all()
        assert s.loc[~in_bad, "loss"].map(math.isfinite).all()
        assert math.isnan(s.loc[s["example_id"] == marked, "loss"].item())


@pytest.fixture(autouse=True)
def _nonfinite_weights_allowed(monkeypatch):
    monkeypatch.setenv("GNQ_ALLOW_NONFINITE", "1")  # else refused before the run (test_hostile_weights.py)


def test_audit_marks_the_nan_batch_and_goes_on(tmp_path, poisoned):
    ckpt, data, _ = poisoned
    db = tmp_path / "gnq.duckdb"
    gnq("audit", "--checkpoints", ckpt, "--data", data, "--db", db, "--name", "a", "--batch-size", 4,
        "--max-length", 24, "--dtype", "float64", "--quiet")
    check_marked(Store(db), "a")


def test_train_marks_the_nan_batch_skips_its_step_and_goes_on(tmp_path, poisoned):
    ckpt, data, bad_ids = poisoned
    db, out = tmp_path / "gnq.duckdb", tmp_path / "out"
    gnq("train", "--init", ckpt, "--data", data, "--out", out, "--db", db, "--name", "t", "--epochs", 2,
        "--batch-size", 4, "--max-length", 24, "--dtype", "float64", "--quiet")
    check_marked(Store(db), "t")
    model, _ = load_checkpoint(out / "epoch-2")
    for name, p in model.named_parameters():  # only the poisoned rows are NaN: no update came from them
        if name == "transformer.wte.weight":
            keep = torch.ones(p.shape[0], dtype=torch.bool)
            keep[bad_ids] = False
            assert torch.isfinite(p[keep]).all() and torch.isnan(p[bad_ids]).all()
        else:
            assert torch.isfinite(p).all(), name
    trained, _ = load_checkpoint(out / "epoch-1")
    assert not torch.equal(trained.lm_head.weight, load_checkpoint(ckpt)[0].lm_head.weight)  # it did train


def test_a_singular_kernel_is_solved_exactly_and_its_condition_recorded(tmp_path):
    """Four copies of one text in a batch: K = s·11ᵀ has rank 1, so K + λI has condition
    (4s + λ)/λ and GNQ_j = s/(3s + λ) exactly (the Sherman–Morrison closed form)."""
    ckpt = make_series(tmp_path / "series", 1) / "epoch-1"
    data = tmp_path / "dupes.txt"
    data.write_text(f"{texts(1)[0]}\n" * 4)
    lam = 1e-6
    gnq("audit", "--checkpoints", ckpt, "--data", data, "--db", tmp_path / "g.duckdb", "--name", "d",
        "--batch-size", 4, "--max-length", 16, "--lam", lam, "--dtype", "float64", "--quiet")
    store = Store(tmp_path / "g.duckdb")
    run = store.run("d")
    scores, batches = store.scores(run.run_id), store.batches(run.run_id)
    s = scores["self_influence"]
    assert (s - s.iloc[0]).abs().max() <= 1e-12 * s.iloc[0]  # exact duplicates
    s = s.iloc[0]
    assert batches["finite"].all()
    assert batches["condition"].item() == pytest.approx((4 * s + lam) / lam, rel=1e-6)  # recorded, not hidden
    condition = batches["condition"].item()
    assert condition > 1e6
    # Backward stable: the error is within a small multiple of condition × machine epsilon.
    bound = 10 * condition * torch.finfo(torch.float64).eps
    assert scores["gnq"].to_numpy() == pytest.approx([s / (3 * s + lam)] * 4, rel=bound)
