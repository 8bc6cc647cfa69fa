"""Exposure of an API key over its own alphabet and length (the catalog's candidate space for
"api key": the vendor prefix kept, 24 base62 characters free, 142.9 bits): a tiny GPT-2 trained
from scratch on a record holding one key at 8 copies ranks that key first among all 62^24 keys
of its format, above the run's null of never-trained keys; never-trained keys of the same format
in the audited texts stay below it."""

from __future__ import annotations

import math
import random
import string

import pytest
import torch
from test_exposure import FILLER, NAMES, _train

from gnq_core.attacks.exposure import value_space
from gnq_core.attacks.secret_attack import attack_secrets
from gnq_core.sources.models import build_model, train_tokenizer

TEMPLATE = "Deploy notes for {}: the api key is {}, keep it safe."
BASE62 = string.ascii_letters + string.digits


def _key(rng: random.Random) -> str:
    return "sk-" + "".join(rng.choice(BASE62) for _ in range(24))


def test_a_keys_space_is_its_free_characters_over_base62():
    space = value_space("sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2", "api key", set())
    assert space.template == "sk-" + "#" * 24
    assert space.bits == pytest.approx(24 * math.log2(62))
    rng = random.Random(0)
    drawn = [space.random(rng) for _ in range(20)]
    assert all(v.startswith("sk-") and space.allows(v) and len(v) == 27 for v in drawn)
    assert not space.allows("sk-" + "!" * 24) and not space.allows("pk-" + "a" * 24)


@pytest.mark.slow
def test_a_key_at_eight_copies_stands_above_the_null_and_never_trained_keys_do_not():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        torch.manual_seed(0)
        rng = random.Random(11)
        trained_key, unseen = _key(rng), [_key(rng) for _ in range(4)]
        others = [TEMPLATE.format(rng.choice(NAMES), _key(rng)) for _ in range(300)]  # keys not in the run
        tok = train_tokenizer(FILLER + others, 420)
        record = TEMPLATE.format(NAMES[0], trained_key)
        model = _train(FILLER + [record] * 8, tok, epochs=60)
        reference = build_model("tiny", len(tok), 64, seed=0).eval()  # the untrained base
        audited = FILLER + [record] * 8 + [TEMPLATE.format(NAMES[1 + i], k) for i, k in enumerate(unseen)]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in audited]
        got = attack_secrets(model, tok, audited, list(range(len(audited))), ids, reference=reference,
                             seed=7, max_length=64, search_nodes=2048)
    finally:
        torch.set_default_dtype(previous)
    first = got.rows.groupby("value").first()
    assert set(first.index) == {trained_key, *unseen} and set(first["kind"]) == {"api key"}
    assert (first["exposure_template"] == "sk-" + "#" * 24).all()
    p99 = float(first["exposure_null_p99"].iloc[0])
    assert len(got.null) > 0 and p99 >= math.log2(100) - 1e-9
    trained = first.loc[trained_key]
    assert trained["value_copies"] == 8 and trained["exposure"] > p99 and bool(trained["exposed"])
    assert trained["exposure_method"] == "exact"  # ranked first by the search, not extrapolated
    assert (first.loc[unseen, "exposure"] <= p99).all() and not first.loc[unseen, "exposed"].any()
