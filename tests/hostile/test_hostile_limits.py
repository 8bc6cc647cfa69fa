"""Checkpoints beyond sane bounds: a config asking for a
billion (or -1) layers, a tokenizer mapping a token past the embedding or with millions of entries,
weights declared larger than the memory, files that are links out of the folder.  Each is refused
in one line naming the file, quickly, before anything is built, parsed or allocated, and the store
is not written."""

from __future__ import annotations

import json
import resource
import shutil
import struct
import time
from pathlib import Path

import pytest
from hostile_helpers import gnq_fails, make_series, write_texts_csv

from gnq_core.sources import limits
from gnq_core.sources.checkpoints.checks import check_checkpoint
from gnq_core.sources.checkpoints.errors import CheckpointError

GIB = 2**30


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return make_series(tmp_path_factory.mktemp("limits"), 1) / "epoch-1"


def variant(good: Path, where: Path, config: dict | None = None) -> Path:
    """A copy of the good checkpoint with config.json fields replaced."""
    shutil.copytree(good, where)
    if config:
        raw = json.loads((where / "config.json").read_text())
        (where / "config.json").write_text(json.dumps({**raw, **config}))
    return where


def refused(folder: Path, match: str, **kwargs) -> str:
    with pytest.raises(CheckpointError, match=match) as info:
        check_checkpoint(folder, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


# --------------------------------------------------------------------------------------------- 1: config


def test_a_billion_layers_is_refused_within_a_second_naming_config_json(good, tmp_path):
    ckpt = variant(good, tmp_path / "huge", {"n_layer": 1_000_000_000})
    t0 = time.perf_counter()
    message = refused(ckpt, "n_layer is 1,000,000,000, above the limit of 1,024 layers")
    assert time.perf_counter() - t0 < 1.0
    assert str(ckpt / "config.json") in message and "GNQ_MAX_LAYERS" in message


@pytest.mark.parametrize("fields, problem", [
    ({"n_layer": -1}, "n_layer is -1; it must be a positive whole number"),
    ({"n_head": 0}, "n_head is 0"),
    ({"n_embd": 1e5}, "n_embd is 100000.0"),
    ({"n_layer": "2"}, 'n_layer is "2"'),
    ({"n_layer": True}, "n_layer is true"),
    ({"vocab_size": 2**40}, "vocab_size is 1,099,511,627,776, above the limit"),
    ({"text_config": {"num_hidden_layers": 10**6}}, "text_config.num_hidden_layers is 1,000,000"),
])
def test_sizes_must_be_positive_whole_numbers_within_bounds(good, tmp_path, fields, problem):
    refused(variant(good, tmp_path / "bad", fields), problem)


def test_the_bounds_are_configurable(good, tmp_path, monkeypatch):
    ckpt = variant(good, tmp_path / "two", {"n_layer": 2})
    monkeypatch.setenv("GNQ_MAX_LAYERS", "1")
    refused(ckpt, "n_layer is 2, above the limit of 1 layers")
    monkeypatch.setenv("GNQ_MAX_LAYERS", "2")
    check_checkpoint(ckpt)


def test_gnq_audit_refuses_minus_one_layers_in_one_line_and_writes_no_store(good, tmp_path):
    ckpt = variant(good, tmp_path / "minus", {"n_layer": -1})
    db = tmp_path / "gnq.duckdb"
    line = gnq_fails("audit", "--checkpoints", ckpt, "--data", write_texts_csv(tmp_path / "t.csv", 8),
                     "--db", db, "--quiet")
    assert str(ckpt / "config.json") in line and "n_layer is -1" in line
    assert not db.exists()


# --------------------------------------------------------------------------------------------- 2: tokenizer


def test_a_token_id_past_the_vocabulary_is_refused(good, tmp_path):
    ckpt = variant(good, tmp_path / "ids")
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    tok["model"]["vocab"]["Ġt"] = 1_000_000  # a common token (" t"), vocabulary still 300 entries
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    refused(ckpt, "the tokenizer maps 'Ġt' to id 1,000,000 but vocab_size in config.json is 300")


def test_a_two_million_entry_vocabulary_is_refused_before_parsing(good, tmp_path):
    ckpt = variant(good, tmp_path / "big")
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    entries = ",".join(f'"t{i}":{i}' for i in range(2_000_000))
    text = json.dumps({**tok, "model": {**tok["model"], "vocab": {}}}).replace('"vocab": {}',
                                                                             '"vocab": {' + entries + "}")
    (ckpt / "tokenizer.json").write_text(text)
    t0 = time.perf_counter()
    message = refused(ckpt, "refused before parsing")
    assert time.perf_counter() - t0 < 2.0  # parsing it takes seconds and ~1.4 GB
    assert str(ckpt / "tokenizer.json") in message


# --------------------------------------------------------------------------------------------- 7: memory


def declare_extra_tensor(ckpt: Path, shape: list[int]) -> int:
    """Add a float32 tensor of ``shape`` to model.safetensors, its bytes a hole in a sparse file."""
    path = ckpt / "model.safetensors"
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    nbytes = 4
    for d in shape:
        nbytes *= d
    header["junk.weight"] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + nbytes]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)
        f.truncate(8 + len(raw) + len(data) + nbytes)
    return nbytes


def test_an_8_gb_tensor_is_refused_against_the_memory_allowed_without_allocating(good, tmp_path, monkeypatch):
    ckpt = variant(good, tmp_path / "sparse")
    declare_extra_tensor(ckpt, [2 * GIB])  # 8 GiB of float32
    monkeypatch.setenv("GNQ_MAX_MEMORY", str(2 * 10**9))
    refused(ckpt, r"the weights need 8\.6 GB of memory to load .* but GNQ_MAX_MEMORY is 2\.0 GB; refused")
    db = tmp_path / "gnq.duckdb"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    line = gnq_fails("audit", "--checkpoints", ckpt, "--data", write_texts_csv(tmp_path / "t.csv", 8),
                     "--db", db, "--max-length", 16, "--quiet")
    assert "8.6 GB" in line and str(ckpt) in line and not db.exists()
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 3 * 2**20 or peak_kib == before  # the child never held the 8 GiB


def test_a_terabyte_tensor_is_refused_against_the_memory_available(good, tmp_path):
    ckpt = variant(good, tmp_path / "tera")
    declare_extra_tensor(ckpt, [1024, GIB // 4])  # 1 TiB: more than any machine running the tests has
    refused(ckpt, r"the weights need 1\d\d\d\.\d GB of memory to load")


def test_the_estimate_is_the_headers_bytes_in_the_load_dtype(good):
    files = [good / "model.safetensors"]
    saved = limits.weights_bytes("safetensors", files)  # as saved (float32)
    assert limits.weights_bytes("safetensors", files, itemsize=8) == 2 * saved  # loaded as float64
    import safetensors.torch

    tensors = safetensors.torch.load_file(files[0])
    assert saved == sum(t.numel() * t.element_size() for t in tensors.values())


# --------------------------------------------------------------------------------------------- links


def test_a_weight_file_linking_out_of_the_folder_is_refused_unless_allowed(good, tmp_path, monkeypatch):
    ckpt = variant(good, tmp_path / "linked")
    outside = tmp_path / "elsewhere.safetensors"
    (ckpt / "model.safetensors").rename(outside)
    (ckpt / "model.safetensors").symlink_to(outside)
    refused(ckpt, "model.safetensors: a link to .*, outside .*; refused")
    monkeypatch.setenv("GNQ_ALLOW_LINKS", "1")
    check_checkpoint(ckpt)


def test_links_inside_the_folder_and_the_hub_cache_layout_are_accepted(good, tmp_path):
    repo = tmp_path / "models--x--tiny"
    snapshot = variant(good, repo / "snapshots" / "abc123")
    (repo / "blobs").mkdir()
    for name in ("model.safetensors", "config.json"):
        (snapshot / name).rename(repo / "blobs" / name)
        (snapshot / name).symlink_to(Path("../../blobs") / name)
    (snapshot / "tokenizer.json").rename(snapshot / "tok.json")
    (snapshot / "tokenizer.json").symlink_to("tok.json")
    check_checkpoint(snapshot)


def test_the_check_builds_the_model_once(good, monkeypatch):
    from transformers import GPT2LMHeadModel

    built = []
    original = GPT2LMHeadModel.__init__

    def counting(self, config, *args, **kwargs):  # every build, by _from_config or from_pretrained
        built.append(config)
        original(self, config, *args, **kwargs)

    monkeypatch.setattr(GPT2LMHeadModel, "__init__", counting)
    check_checkpoint(good)
    assert len(built) == 1
