"""The secret-targeted attack (attacks/secret_attack.py): the model is prompted with a text up
to its secret-like value and must write the value itself.

Scenario, through the real ``gnq`` command: a tiny GPT-2 is trained from scratch until it writes
out planted unique secrets (a PIN, a phone number, a card number, a password) after their
lead-in; the audited dataset also holds secret texts of the same formats it never saw.  Each
planted secret the final checkpoint writes out (checked here with ``model.generate``, not the
tool's decoder) is marked "secret reproduced"; the unseen ones, whose generated window holds
none of the secret's characters, are not.
"""

from __future__ import annotations

import random
import shutil

import pandas as pd
import pytest
import torch
from cli_helpers import gnq
from scenario_data import card, scenario

from gnq_core.analysis.verdict import rank_texts
from gnq_core.attacks.secret_attack import chars_reproduced, secret_targets
from gnq_core.results.store import Store
from gnq_core.sources.checkpoints.load import load_checkpoint
from gnq_core.sources.secrets import find_secrets

COMMON = ["--batch-size", 8, "--max-length", 40, "--threads", 1, "--quiet"]


def _planted(rng: random.Random, name: str, i: int) -> str:
    kinds = [
        lambda: f"Note for {name}: the door PIN is {rng.randrange(10_000):04d}, keep it.",
        # a London number (020 7xxx xxxx): unlabelled phones are found only when valid in their plan
        lambda: f"Call {name} on the private line +44 20 7{rng.randrange(100, 999)} "
                f"{rng.randrange(1000, 9999)} now.",
        lambda: f"Charge {name}'s card {card(rng)} today.",
        lambda: f"The vault password for {name} is {rng.choice(['Tinsel', 'Marble'])}"
                f"{rng.randrange(10, 99)}x.",
    ]
    return kinds[i % len(kinds)]()


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    db = root / "gnq.duckdb"
    rng = random.Random(3)
    filler = scenario(seed=1, n_filler=24, n_secrets=0, n_records=0, predictable_copies=0)["text"].tolist()
    names = ["Anna Berg", "Tom Okafor", "Lena Novak", "Ravi Menon", "Ines Duarte", "Omar Haddad",
             "Julia Sato", "Felix Brandt", "Nora Quist", "Sam Adeyemi", "Clara Voss", "Milan Horak"]
    planted = [_planted(rng, n, i) for i, n in enumerate(names[:8])]
    unseen = [_planted(rng, n, i) for i, n in enumerate(names[8:])]
    train = pd.DataFrame({"text": filler + planted})
    train.to_csv(root / "train.csv", index=False)
    everything = pd.DataFrame({"text": filler + planted + unseen,
                               "group": ["filler"] * len(filler) + ["planted"] * 8 + ["unseen"] * 4})
    everything.to_csv(root / "all.csv", index=False)
    # `gnq train` runs in this process: its weights are drawn in torch's default dtype, so pin the
    # CLI's (float32) whatever an earlier test left behind
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        _train_and_audit(root, db)
    finally:
        torch.set_default_dtype(previous)
    store = Store(db)
    run = store.run("audit")
    return root, store, run, everything


def _train_and_audit(root, db) -> None:
    gnq("train", "--data", root / "train.csv", "--from-scratch", "--preset", "tiny", "--epochs", 40,
        "--lr", 5e-3, "--vocab-size", 400, "--out", root / "run", "--db", db, *COMMON)
    picked = root / "picked"
    for label in ("epoch-1", "epoch-40"):
        shutil.copytree(root / "run" / label, picked / label)
    gnq("audit", "--checkpoints", picked, "--data", root / "all.csv", "--name", "audit", "--db", db, *COMMON)
    gnq("extract", "--run", "audit", "--db", db, "--threads", 1, "--quiet")


def _writes_secret(model, tokenizer, text: str) -> tuple[bool, int]:
    """Independently of the tool: prompt with the text up to the value's token, generate with
    Hugging Face's own greedy search, and count the value's characters in the output."""
    s = find_secrets(text)[0]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    target = secret_targets(tokenizer, [text], [0], [ids])[0]
    prompt = torch.tensor([target.prompt_ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=len(target.target_ids), min_new_tokens=len(target.target_ids),
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    generated = tokenizer.decode(out[0, prompt.shape[1]:].tolist())
    n, hits = chars_reproduced(s.value, tokenizer.decode(target.target_ids), generated)
    return hits == n, hits


@pytest.mark.slow
def test_planted_secrets_the_model_writes_are_marked_and_unseen_ones_are_not(audited):
    root, store, run, data = audited
    model, tokenizer = load_checkpoint(root / "picked" / "epoch-40", device=torch.device("cpu"))
    first, _ = load_checkpoint(root / "picked" / "epoch-1", device=torch.device("cpu"))
    totals = store.example_totals(run.run_id).set_index("example_id").sort_index()
    rows = store.secret_attacks(run.run_id).set_index("example_id")
    planted = data.index[data["group"] == "planted"]
    unseen = data.index[data["group"] == "unseen"]
    assert set(rows.index) == set(planted) | set(unseen)  # every secret text, no filler text
    written = {i: _writes_secret(model, tokenizer, data.loc[i, "text"]) for i in [*planted, *unseen]}
    assert sum(written[i][0] for i in planted) >= 6, "training should make the model write its secrets"
    for i in planted:
        ref_writes = _writes_secret(first, tokenizer, data.loc[i, "text"])[0]
        assert bool(totals.loc[i, "secret_reproduced"]) == (written[i][0] and not ref_writes), i
        assert rows.loc[i, "chars_reproduced"] == written[i][1]
    for i in unseen:  # never trained on: the generated window holds (almost) none of its characters
        assert not written[i][0] and not totals.loc[i, "secret_reproduced"]
    assert totals.loc[data["group"] == "filler", "secret_reproduced"].isna().all()
    # exposure: a written-out PIN / card / phone ranks first among the values of its space (exact),
    # or its estimate goes past log2 N = 7 bits, where a sampled rank stops
    digits = rows.loc[[i for i in planted if written[i][0]]].query("kind in ['pin', 'card number', 'phone']")
    assert len(digits) and (digits["exposure"] > 5).all()
    exact = digits["exposure_method"] == "exact"
    assert (digits.loc[exact, "exposure_rank"] == 1).all()
    assert rows.loc[unseen, "exposure"].dropna().lt(7).all()
    assert rows.loc[unseen, "exposed"].dropna().eq(False).all()
    # the rule is recorded in the rows and in the run's settings; the verdict uses the secret
    assert rows["rule"].str.startswith("secret reproduced = prompted with the text up to").all()
    # the run records its model's and dataset's sha256 (an audit: its latest checkpoint's weights)
    info = store.runs().set_index("name").loc["audit"]
    assert info["model_hash"] == store.points(run.run_id)["model_hash"].iloc[-1]
    assert len(info["model_hash"]) == 64
    assert len(run.dataset_hash) == 64
    attack = run.settings["attack"]
    assert attack["secrets_attacked"] == len(rows) and attack["secret_rule"] == rows["rule"].iloc[0]
    ranked = rank_texts(store.example_totals(run.run_id)).set_index("example_id")
    marked = totals.index[totals["secret_reproduced"].fillna(False).astype(bool)]
    assert (ranked.loc[marked, "status"] == "leaked").all()
    assert ranked.loc[marked, "reason"].str.contains("writes the").all()
    assert (ranked.loc[unseen, "status"] != "leaked").all()


def test_value_tokens_and_characters():
    from lm_fixtures import tokenizer as tiny_tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer())
    text = "Note for Anna: the door PIN is 4821, keep it."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    (t,) = secret_targets(tok, [text], [7], [ids])
    assert t.value == "4821" and text[t.value_start:t.value_end] == "4821"
    # this tokenizer decodes with a space between tokens ("4 8 2 1"): compared by letters and digits
    assert tok.decode(t.target_ids).replace(" ", "") == "4821" and "4" not in tok.decode(t.prompt_ids)
    assert chars_reproduced(t.value, tok.decode(t.target_ids), "4 8 2 9") == (4, 3)
    assert t.prompt_ids + t.target_ids == ids[: len(t.prompt_ids) + len(t.target_ids)]
    # the value's letters and digits at their position; separators do not count
    assert chars_reproduced("4539 1488", " 4539 1488", " 4539 1400") == (8, 6)
    assert chars_reproduced("4821", " 4821", " his ") == (4, 0)
    # a value the kept tokens cut off is not attackable
    assert secret_targets(tok, [text], [7], [ids[:5]]) == []


def test_a_text_window_without_the_secret_is_not_a_leak():
    """" card 4539 14" coming out of the text attack's window is not the card number leaking."""
    base = {"text": "x", "copies": 1, "attack_prefix_tokens": 12, "attack_suffix_tokens": 8,
            "reference_match": 0.2, "reproduced": True, "extracted": True, "secret": "card number",
            "reference_secret_chars_reproduced": 0, "secret_exposure": 3.0, "secret_chars": 16}
    totals = pd.DataFrame([
        base | {"example_id": 0, "secret_reproduced": False, "secret_chars_reproduced": 4},
        base | {"example_id": 1, "secret_reproduced": True, "secret_chars_reproduced": 16},
        base | {"example_id": 2, "secret": None, "secret_reproduced": None, "secret_chars": None,
                "secret_chars_reproduced": None},  # no secret: the text attack decides
    ])
    ranked = rank_texts(totals).set_index("example_id")
    assert ranked.loc[0, "status"] == "text reproduced" and ranked.loc[1, "status"] == "leaked"
    assert ranked.loc[2, "status"] == "leaked"
    assert ranked.loc[0, "reason"].startswith("text reproduced, the value not: prompted with the text up to "
                                              "it")
    assert "writes 4 of 16 characters of the card-number-like string" in ranked.loc[0, "reason"]
    assert "next 8 tokens after the first 12 do come out" in ranked.loc[0, "reason"]
    assert ranked.loc[1, "reason"].startswith("leaked: prompted with the text up to it, the model writes the "
                                              "card-number-like string (16 of 16 characters)")
    assert ranked.loc[1, "rank"] < ranked.loc[0, "rank"]


def test_characters_the_format_explains_are_not_a_partial_leak():
    """"+44 20 7946" that every phone number of a data set shares is the format: a model that
    writes it has learned the format, not the secret (partly leaked)."""
    from gnq_core.attacks.secret_attack import format_places, matched_chars
    from gnq_core.results.store_schema import partly_leaked

    others = ["+44 20 7946 9240", "+44 20 7946 3931", "+44 20 7946 0012"]
    assert format_places("+44 20 7946 7554", others) == set(range(8))
    assert format_places("+44 20 7946 7554", []) == set()
    n, places = matched_chars("+44 20 7946 7554", " +44 20 7946 7554", " +44 20 7946 1111")
    assert (n, places) == (12, list(range(8)))
    novel = len(set(places) - format_places("+44 20 7946 7554", others))
    assert novel == 0 and not partly_leaked(n, len(places), 0, novel)
    assert partly_leaked(n, len(places), 0)  # without the format, 8 of 12 would be partly leaked
    # a card sharing only its first digit with the run's other card: its first 8 digits are its own
    n, places = matched_chars("4539 1488 7712 3390", " 4539 1488 7712 3390", " 4539 1488 0343 6467")
    novel = len(set(places) - format_places("4539 1488 7712 3390", ["4929 1830 5527 6614"]))
    assert (n, len(places), novel) == (16, 8, 5) and partly_leaked(n, len(places), 2, novel)


def test_a_tie_between_characters_is_the_format_for_both():
    """Half the others with one character and half with another: either is the format, whatever the
    hash seed (it decided before: 6 of the demo's 168 secret-attack rows changed between runs)."""
    from gnq_core.attacks.secret_attack import format_places

    others = ["12", "21"]
    assert format_places("11", others) == {0, 1}
    assert format_places("22", others) == {0, 1}
    assert format_places("31", others) == {1}
    assert format_places("33", others + ["44"]) == set()
