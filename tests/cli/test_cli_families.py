"""`gnq audit` on checkpoints of other families, written with transformers' own save_pretrained:
GPT-NeoX in the Pythia layout (its head is saved as `embed_out`) and Mixtral (experts saved one
by one, fused when loaded).  The stored GNQ equals explicit per-example gradients (float64).
A family the engine cannot cover is refused in one line on stderr with exit code 1."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from conftest import rel_err
from lm_fixtures import texts
from safetensors import safe_open
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    RecurrentGemmaConfig,
    RecurrentGemmaForCausalLM,
    RwkvConfig,
    RwkvForCausalLM,
)
from typer.testing import CliRunner

from gnq_core.cli import app
from gnq_core.engine.math.losses import per_example_lm_loss
from gnq_core.engine.math.reference import loo_gnq, per_example_gradients
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.models import train_tokenizer
from gnq_core.sources.tokens import collate, encode_texts, pad_id

pytestmark = pytest.mark.slow
VOCAB, LAM, B, T = 300, 0.05, 4, 16


def pythia(vocab: int) -> GPTNeoXForCausalLM:
    return GPTNeoXForCausalLM(GPTNeoXConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, tie_word_embeddings=False, use_parallel_residual=True,
        bos_token_id=0, eos_token_id=0))


def mixtral(vocab: int) -> MixtralForCausalLM:
    return MixtralForCausalLM(MixtralConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def rwkv(vocab: int) -> RwkvForCausalLM:  # its state is a cache updated in place: audits run without
    return RwkvForCausalLM(RwkvConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                      attention_hidden_size=32, intermediate_size=64, context_length=64))


def recurrent_gemma(vocab: int) -> RecurrentGemmaForCausalLM:
    return RecurrentGemmaForCausalLM(RecurrentGemmaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, lru_width=32, attention_window_size=16, pad_token_id=0,
        bos_token_id=0, eos_token_id=0))


EXPERT_0 = "model.layers.0.block_sparse_moe.experts.0.w1.weight"


def audit_checkpoint(tmp_path, build, saved_key=None):
    rows = list(texts(12))
    data = tmp_path / "texts.csv"
    pd.DataFrame({"text": rows}).to_csv(data, index=False)
    tok = train_tokenizer(rows, vocab_size=VOCAB)
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt"
    build(len(tok)).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    if saved_key is not None:
        with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
            assert saved_key in f.keys()  # noqa: SIM118  (the saved layout differs from the model's)
    db = tmp_path / "gnq.duckdb"
    args = ["audit", "--checkpoints", ckpt, "--data", data, "--db", db, "--lam", LAM, "--batch-size", B,
            "--max-length", T, "--dtype", "float64", "--quiet"]
    return CliRunner().invoke(app, [str(a) for a in args]), rows, ckpt, db


def test_a_refused_family_is_one_line_on_stderr(tmp_path):
    result, *_ = audit_checkpoint(tmp_path, recurrent_gemma)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "recurrent_gemma" in lines[0] and "rg_lru" in lines[0], result.stderr
    assert Store(tmp_path / "gnq.duckdb").scores(Store(tmp_path / "gnq.duckdb").run("ckpt").run_id).empty


@pytest.mark.parametrize("build, saved_key",
                         [(pythia, "embed_out.weight"), (mixtral, EXPERT_0), (rwkv, None)])
def test_audit_of_a_save_pretrained_checkpoint_is_exact(tmp_path, build, saved_key):
    result, rows, ckpt, db = audit_checkpoint(tmp_path, build, saved_key)
    assert result.exit_code == 0, result.output

    model, tok = load_checkpoint(ckpt, dtype=torch.float64)
    model.config.use_cache = False  # as the audit does (RWKV's state cache is updated in place)
    if getattr(model.config, "_experts_implementation", None) not in (None, "eager"):
        model.set_experts_implementation("eager")  # grouped matmuls take no float64
    store = Store(db)
    scores = store.scores(store.run("ckpt").run_id)
    part = scores.query("batch_index == 1")["example_id"].tolist()  # the audit's batch (copies apart)
    assert len(part) == B
    ids = encode_texts(tok, rows, T)
    batch = collate([ids[i] for i in part], part, pad_id(tok))
    losses = per_example_lm_loss(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                                 batch.labels)
    G = per_example_gradients(losses, [p for p in model.parameters()])
    stored = scores.set_index("example_id").loc[part]
    K = G @ G.T
    assert rel_err(torch.tensor(stored["self_influence"].to_numpy()), K.diagonal()) < 1e-9
    # GNQ through the solve: RWKV's untrained gradients give GNQ ~ 1e8 here, and K + λI a condition
    # number ~ 1e10, so float64 leaves it ~8 digits
    assert rel_err(torch.tensor(stored["gnq"].to_numpy()), loo_gnq(G, LAM)) < 1e-6
