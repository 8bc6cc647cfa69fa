"""`python -m research study companions --quick`: the report, and GNQ against companions checked
against the exact GNQ of the engine (an identity-sized sketch on a float64 tiny Llama)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from gnq_core.engine.auditor import GNQAuditor
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.solve import gnq_from_kernel
from gnq_core.sources.tokens import collate, encode_texts, pad_id
from research.cli import app
from research.studies import companions as co


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("companions")
    threads = torch.get_num_threads()
    args = ["study", "companions", "--quick", "--db", root / "gnq.duckdb", "--reports", root / "reports",
            "--work", root / "work", "--quiet"]
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    torch.set_num_threads(threads)
    return SimpleNamespace(root=root, work=root / "work" / "companions-quick",
                           report=root / "reports" / "companions-quick")


def test_report_states_records_seeds_and_shares(built):
    text = (built.report / "report.md").read_text()
    results = json.loads((built.report / "results.json").read_text())
    assert results["seeds"] == [0, 1] and "Seeds finished: 0, 1 of 0, 1" in text
    assert "python -m research study companions --db" in text and "--quick" in text
    assert "positive_records" in text
    shares = results["shares"]
    assert {r["c"] for r in shares} == {"4", "16", "all"}
    for r in shares:
        assert 0.0 <= r["share p10"] <= r["share median"] <= r["share p90"] <= 1.0
    records = [r for r in results["outcomes"] if r["outcome"] == "membership"]
    # members: 24 corpus texts + 8 records (2 copies each, one record apiece); non-members 16 + 8
    assert {(r["positive_records"], r["negative_records"]) for r in records} == {(32, 24)}
    # the identity-sized sketch of the quick config reproduces the exact batch
    exact = [r for r in results["sketch_error"]["rows"] if r["k"] == 1 << 16]
    assert exact and max(r["median_rel_error"] for r in exact) < 1e-9


def test_all_companions_equal_the_exact_leave_one_out(built):
    """c = all with an identity-sized sketch: each member's GNQ against all other members equals
    the engine's exact GNQ of all member texts audited as one batch (float64); a non-member's
    equals its leave-one-out GNQ in the exact batch of the members plus itself."""
    cfg = co.QUICK
    res = co.analyse_seed(co.seed_dir(built.work, 0), cfg)
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = co.seed_dir(built.work, 0) / "model"
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float64)
    tok = AutoTokenizer.from_pretrained(folder)
    frame = res.frame
    members = frame[frame["member"]]
    outsider = frame[~frame["member"]].iloc[0]

    def exact(texts: list[str]) -> np.ndarray:
        ids = encode_texts(tok, texts, cfg.max_length)
        b = collate(ids, list(range(len(ids))), pad_id(tok))
        with GNQAuditor(model, lam=cfg.lam, fused=False) as auditor:
            loss = per_example_lm_loss(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits,
                                       b.labels)
            auditor.backward(loss.sum())
            K = auditor.compute().kernel
        model.zero_grad(set_to_none=True)
        return gnq_from_kernel(K, cfg.lam).gnq.numpy()

    want = exact(members["text"].tolist())
    np.testing.assert_allclose(members[f"gnq_{co.ALL}"].to_numpy(), want, rtol=1e-8)
    with_outsider = exact([*members["text"].tolist(), outsider["text"]])
    np.testing.assert_allclose(outsider[f"gnq_{co.ALL}"], with_outsider[-1], rtol=1e-8)


def test_against_is_the_leave_one_out_of_the_set_plus_the_text():
    rng = np.random.default_rng(0)
    G = rng.normal(size=(12, 7))
    K = G @ G.T
    companions, texts = np.arange(6), np.array([8, 10])
    got = co.against(K, companions, texts, 0.3)
    for j, value in zip(texts, got, strict=True):
        idx = np.append(companions, j)
        sub = torch.from_numpy(K[np.ix_(idx, idx)])
        assert value == pytest.approx(float(gnq_from_kernel(sub, 0.3).gnq[-1]), rel=1e-10)


def test_companion_sets_have_c_companions_and_shares_in_unit_interval():
    rng = np.random.default_rng(1)
    G = rng.normal(size=(30, 40))
    K = G @ G.T
    member = np.arange(30) < 22
    for c in (3, 5, co.ALL):
        g = co.gnq_at(K, member, c, 0.1, seed=0)
        share = 1 - g * 0.1 / np.diag(K)
        assert np.isfinite(g).all() and ((share >= -1e-12) & (share <= 1 + 1e-12)).all()
    # a member's GNQ at c = 21 (all other members) equals the "all" value
    np.testing.assert_allclose(co.gnq_at(K, member, 21, 0.1, 0)[member],
                               co.gnq_at(K, member, co.ALL, 0.1, 0)[member])


def test_bad_seeds_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["study", "companions", "--quick", "--seeds", "0,x", "--db",
                                      str(tmp_path / "gnq.duckdb")])
    assert result.exit_code == 1 and "--seeds" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_full_scale_loads_the_fetched_smollm2_checkpoint(tmp_path, monkeypatch):
    """The full scale's model is the cached SmolLM2 checkpoint, loaded as float32 (its loader's
    import once named a module that no longer exists, so only --quick could run)."""
    from gnq_core.sources import real_models
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import build_model, train_tokenizer

    tok = train_tokenizer(["a few words to train a tokenizer on", "and a few more"], vocab_size=300)
    save_checkpoint(build_model("tiny", vocab_size=len(tok), max_length=32, seed=0,
                                eos_token_id=tok.eos_token_id).double(), tok, tmp_path / "smollm2")
    monkeypatch.setattr(real_models, "fetch_model", lambda name: tmp_path / name)
    model, loaded = co.load_model(co.FULL, [], seed=0)
    assert next(model.parameters()).dtype == torch.float32 and len(loaded) == len(tok)
