"""gnq_core.sources.models (fresh tokenizers and models) and gnq_core.sources.checkpoints
(find, hash, load, save).

Checkpoint folders are untrusted: every malformed one must give a one-line CheckpointError that
names the file or folder, and a malicious pickle must never run.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from lm_fixtures import texts
from safetensors.torch import load_file, save_file
from transformers import BertConfig, PreTrainedTokenizerFast

from gnq_core.sources.checkpoints.errors import CheckpointError
from gnq_core.sources.checkpoints.files import CheckpointRef, checkpoint_hash
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.checkpoints.save import save_checkpoint
from gnq_core.sources.checkpoints.series import find_checkpoints
from gnq_core.sources.models import PRESETS, build_model, train_tokenizer

VOCAB = 400
MAX_LEN = 32


@functools.cache
def tokenizer(vocab_size: int = VOCAB) -> PreTrainedTokenizerFast:
    return train_tokenizer(texts(200), vocab_size=vocab_size)


def make_checkpoint(path: Path, seed: int = 0) -> torch.nn.Module:
    tok = tokenizer()
    model = build_model("tiny", len(tok), MAX_LEN, seed)
    save_checkpoint(model, tok, path)
    return model


def sample_ids() -> torch.Tensor:
    tok = tokenizer()
    return torch.tensor([tok.encode(t)[:MAX_LEN] for t in texts(3)[:1]])


def raises_about(where: str, *fragments: str, **load_kwargs):
    """Context: a CheckpointError whose one-line message names `where` and contains each fragment."""

    class _Check:
        def __enter__(self):
            self._ctx = pytest.raises(CheckpointError)
            self.info = self._ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self._ctx.__exit__(*exc)
            message = str(self.info.value)
            assert "\n" not in message, message
            assert where in message, message
            for fragment in fragments:
                assert fragment in message, message
            return handled

    return _Check()


def edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


# --------------------------------------------------------------------------------------------- models


def test_tokenizer_is_deterministic_and_round_trips_real_text():
    a = train_tokenizer(texts(200), vocab_size=VOCAB)
    b = train_tokenizer(texts(200), vocab_size=VOCAB)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert len(a) == VOCAB
    for t in texts(2000):
        ids = a.encode(t)
        assert a.decode(ids) == t
        assert a.convert_tokens_to_ids("<|endoftext|>") not in ids  # nothing added around the text
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(a, name) == "<|endoftext|>"
    assert a.pad_token_id == a.eos_token_id == 0
    odd = "naïve café — 東京 🚀 \\ tabs\tand\nnewlines"
    assert a.decode(a.encode(odd)) == odd
    with pytest.raises(ValueError, match="at least 257"):
        train_tokenizer(texts(10), vocab_size=100)


def test_build_model_presets_are_seeded_gpt2():
    tiny = build_model("tiny", VOCAB, 48, seed=3)
    cfg = tiny.config
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head) == (2, 64, 4)
    assert cfg.vocab_size == VOCAB and cfg.n_positions >= 48
    assert cfg.bos_token_id == cfg.eos_token_id == cfg.pad_token_id == 0
    assert tiny.lm_head.weight is tiny.transformer.wte.weight
    again = build_model("tiny", VOCAB, 48, seed=3)
    other = build_model("tiny", VOCAB, 48, seed=4)
    for (name, p), q in zip(tiny.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert not torch.equal(tiny.transformer.wte.weight, other.transformer.wte.weight)

    small = build_model("small", VOCAB, 16, seed=0).config
    assert (small.n_layer, small.n_embd, small.n_head) == (4, 256, 4)
    assert set(PRESETS) >= {"tiny", "small"}
    with pytest.raises(ValueError, match="tiny") as info:
        build_model("huge", VOCAB, 16, seed=0)
    assert "small" in str(info.value) and "huge" in str(info.value)


# --------------------------------------------------------------------------------------------- round trip


def test_save_find_load_round_trip_gives_identical_logits(tmp_path):
    model = make_checkpoint(tmp_path / "run" / "epoch-1")
    model.eval()
    refs = find_checkpoints(tmp_path / "run")
    assert refs == [CheckpointRef("epoch-1", (tmp_path / "run" / "epoch-1").resolve(), 1)]
    loaded, tok = load_checkpoint(refs[0].path)
    assert not loaded.training
    assert loaded.dtype == torch.float64  # the dtype it was saved in (tests default to float64)
    ids = sample_ids()
    saved = model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in loaded.state_dict().items())  # weights bit for bit
    with torch.no_grad():  # the same weights; the forward may reduce in another order (1e-16 seen under load)
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-12)
    text = texts(5)[4]
    assert tok.encode(text) == tokenizer().encode(text)
    assert tok.pad_token == tok.eos_token == "<|endoftext|>"

    as32, _ = load_checkpoint(refs[0].path, dtype=torch.float32)
    assert as32.dtype == torch.float32 and not as32.training
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["epoch-1"]  # no *.tmp-* / *.old-* left


def test_save_overwrites_atomically_and_an_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "run" / "epoch-1"
    make_checkpoint(target, seed=0)
    first = checkpoint_hash(target)
    make_checkpoint(target, seed=1)  # overwrite an existing checkpoint
    second = checkpoint_hash(target)
    assert first != second
    assert sorted(p.name for p in target.parent.iterdir()) == ["epoch-1"]

    tok = tokenizer()
    model = build_model("tiny", len(tok), MAX_LEN, seed=2)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. Ctrl-C after the weights were written

    monkeypatch.setattr(type(tok), "save_pretrained", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, tok, target)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, tok, tmp_path / "run" / "epoch-2")
    assert sorted(p.name for p in target.parent.iterdir()) == ["epoch-1"]
    assert checkpoint_hash(target) == second  # the previous checkpoint is untouched
    assert [r.label for r in find_checkpoints(tmp_path / "run")] == ["epoch-1"]


def test_sharded_safetensors_and_plain_state_dict_bin_load(tmp_path):
    model = make_checkpoint(tmp_path / "ref")
    model.eval()
    ids = sample_ids()
    expected = model(ids).logits.detach()

    sharded = tmp_path / "sharded"
    shutil.copytree(tmp_path / "ref", sharded)
    (sharded / "model.safetensors").unlink()
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 1
    loaded, _ = load_checkpoint(sharded)
    assert torch.equal(loaded(ids).logits, expected)
    checkpoint_hash(sharded)

    binary = tmp_path / "binary"
    shutil.copytree(tmp_path / "ref", binary)
    (binary / "model.safetensors").unlink()
    torch.save(model.state_dict(), binary / "pytorch_model.bin")
    torch.save({"lr": 0.1}, binary / "training_args.bin")  # trainer leftovers are not weights
    loaded, _ = load_checkpoint(binary)
    assert torch.equal(loaded(ids).logits, expected)

    with raises_about("binary", "allow_pickle_weights=False", "pytorch_model.bin"):
        load_checkpoint(binary, allow_pickle_weights=False)

    (binary / "pytorch_model.bin").rename(binary / "weights.pt")  # any single *.pt / *.bin
    loaded, _ = load_checkpoint(binary)
    assert torch.equal(loaded(ids).logits, expected)


# --------------------------------------------------------------------------------------------- finding


def _fake_checkpoints(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text("{}")


@pytest.mark.parametrize("names, expected", [
    (["epoch-10", "epoch-2", "epoch-1"], [("epoch-1", 1), ("epoch-2", 2), ("epoch-10", 10)]),
    (["checkpoint-1000", "checkpoint-500", "checkpoint-1500"],
     [("checkpoint-500", 500), ("checkpoint-1000", 1000), ("checkpoint-1500", 1500)]),
    (["step-20", "step-3", "step-100"], [("step-3", 3), ("step-20", 20), ("step-100", 100)]),
    (["run9", "run10", "final", "best"], [("run9", 9), ("run10", 10), ("best", 11), ("final", 12)]),
    (["zeta", "alpha", "mid"], [("alpha", 0), ("mid", 1), ("zeta", 2)]),
])
def test_find_checkpoints_orders_by_trailing_number(tmp_path, names, expected):
    _fake_checkpoints(tmp_path, names)
    _fake_checkpoints(tmp_path, ["epoch-99.tmp-1234", "epoch-1.old-77", ".hidden-5"])  # never listed
    (tmp_path / "logs-7").mkdir()  # no config.json: not a checkpoint
    (tmp_path / "notes-3.txt").write_text("x")
    refs = find_checkpoints(tmp_path)
    assert [(r.label, r.order) for r in refs] == expected
    assert all(r.path == (tmp_path / r.label).resolve() for r in refs)


def test_find_checkpoints_single_folder_and_errors(tmp_path):
    _fake_checkpoints(tmp_path, ["model"])
    (tmp_path / "model" / "sub-1").mkdir()
    (tmp_path / "model" / "sub-1" / "config.json").write_text("{}")
    assert find_checkpoints(tmp_path / "model") == [CheckpointRef("model", (tmp_path / "model").resolve(), 0)]
    _fake_checkpoints(tmp_path, ["epoch-4"])
    assert find_checkpoints(str(tmp_path / "epoch-4"))[0].order == 4

    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    with raises_about("empty", "no checkpoint folders (no config.json here or in any subfolder)"):
        find_checkpoints(empty)
    with raises_about("config.json", "not a directory"):
        find_checkpoints(tmp_path / "model" / "config.json")
    with raises_about("missing", "no such directory"):
        find_checkpoints(tmp_path / "missing")


# --------------------------------------------------------------------------------------------- hashing


def test_checkpoint_hash_tracks_weights_and_config_only(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    base = checkpoint_hash(ckpt)
    assert len(base) == 64 and base == checkpoint_hash(ckpt)

    (ckpt / "README.md").write_text("notes")
    tok_file = ckpt / "tokenizer_config.json"
    tok_file.write_text(tok_file.read_text() + "\n")
    assert checkpoint_hash(ckpt) == base

    weights = load_file(ckpt / "model.safetensors")
    weights["transformer.ln_f.bias"] = weights["transformer.ln_f.bias"] + 1e-3
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    changed = checkpoint_hash(ckpt)
    assert changed != base

    edit_config(ckpt, note="edited")
    assert checkpoint_hash(ckpt) not in (base, changed)


# --------------------------------------------------------------------------------------------- errors


def test_broken_config_json(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    (ckpt / "config.json").write_text('{"model_type": "gpt2", ')
    with raises_about("epoch-1/config.json", "not valid JSON"):
        load_checkpoint(ckpt)
    (ckpt / "config.json").write_text("[1, 2]")
    with raises_about("epoch-1/config.json", "not a JSON object"):
        load_checkpoint(ckpt)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "my-secret-arch", "auto_map": {}}))
    with raises_about("epoch-1", "unknown model type 'my-secret-arch'"):
        load_checkpoint(ckpt)


def test_no_weight_files(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    (ckpt / "model.safetensors").unlink()
    with raises_about("epoch-1", "no weight files"):
        load_checkpoint(ckpt)
    with raises_about("epoch-1", "no weight files"):
        checkpoint_hash(ckpt)


def test_truncated_safetensors(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with raises_about("epoch-1/model.safetensors", "corrupt or truncated"):
        load_checkpoint(ckpt)


def test_malicious_pickle_is_never_executed(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    (ckpt / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"transformer.wte.weight": torch.zeros(2), "evil": Payload()}, ckpt / "pytorch_model.bin")
    with raises_about("epoch-1/pytorch_model.bin", "refusing to unpickle", "convert it to safetensors"):
        load_checkpoint(ckpt)
    assert not marker.exists()
    with raises_about("epoch-1", "allow_pickle_weights=False"):
        load_checkpoint(ckpt, allow_pickle_weights=False)
    assert not marker.exists()


def test_weights_that_do_not_match_the_config(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    edit_config(ckpt, n_positions=MAX_LEN * 2)  # wpe in the file has MAX_LEN rows
    with raises_about("epoch-1", "shape mismatch", "transformer.wpe.weight"):
        load_checkpoint(ckpt)

    edit_config(ckpt, n_positions=MAX_LEN)
    weights = load_file(ckpt / "model.safetensors")
    del weights["transformer.h.1.mlp.c_fc.weight"]
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    with raises_about("epoch-1", "missing", "transformer.h.1.mlp.c_fc.weight"):
        load_checkpoint(ckpt)


def test_bert_is_not_a_causal_lm(tmp_path):
    for name, architectures in [("bert-plain", None), ("bert-mlm", ["BertForMaskedLM"])]:
        ckpt = tmp_path / name
        make_checkpoint(ckpt)
        (ckpt / "config.json").unlink()
        BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                   intermediate_size=32, architectures=architectures).save_pretrained(ckpt)
        with raises_about(name, "model type 'bert' is not a causal language model"):
            load_checkpoint(ckpt)


def test_tokenizer_missing_or_larger_than_the_vocabulary(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (ckpt / name).unlink()
    with raises_about("epoch-1", "no tokenizer files"):
        load_checkpoint(ckpt)

    tokenizer(VOCAB + 50).save_pretrained(ckpt)
    with raises_about("epoch-1", f"{VOCAB + 50} tokens", f"vocab_size {VOCAB}"):
        load_checkpoint(ckpt)


def test_tokenizer_without_pad_gets_eos(tmp_path):
    ckpt = tmp_path / "epoch-1"
    make_checkpoint(ckpt)
    tok_config = json.loads((ckpt / "tokenizer_config.json").read_text())
    tok_config.pop("pad_token", None)
    (ckpt / "tokenizer_config.json").write_text(json.dumps(tok_config))
    _, tok = load_checkpoint(ckpt)
    assert tok.pad_token == tok.eos_token == "<|endoftext|>"


def test_not_a_checkpoint_folder(tmp_path):
    with raises_about("nowhere", "no such checkpoint folder"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "file.txt").write_text("x")
    with raises_about("file.txt", "not a directory"):
        load_checkpoint(tmp_path / "file.txt")
    (tmp_path / "no-config").mkdir()
    with raises_about("no-config", "no config.json"):
        load_checkpoint(tmp_path / "no-config")
