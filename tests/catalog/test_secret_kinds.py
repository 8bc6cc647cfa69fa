"""The catalog's secret kinds, found in real text: recall on planted values of every kind the
catalog detects offline (keys of any vendor, addresses, names in a record's context with dates
of birth, phone numbers by numbering plan, IBANs by check digits; national identity numbers in
test_national_ids.py), precision on ordinary text
(AG News and WikiText from ../shared/data: at most 1 false detection per 1,000 texts per kind),
and the catalog's own contract (every kind has its words and action; adding one is one entry)."""

from __future__ import annotations

import csv
import dataclasses
import random
import re
import string
from collections import Counter
from pathlib import Path

import pytest
from lm_fixtures import SHARED_DATA

import gnq_core.sources.secrets as secrets
from gnq_core import catalog
from gnq_core.catalog.detectors import regex
from gnq_core.catalog.keys import entropy, random_like
from gnq_core.sources.secrets import find_secrets

_RNG = random.Random(55)


def _run(n: int, alphabet: str = catalog.BASE62) -> str:
    while True:  # a random run has both cases and digits almost always; redraw the rare one without
        run = "".join(_RNG.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in run) and any(c.isupper() for c in run) and any(c.islower() for c in run):
            return run


def found(text: str) -> set[tuple[str, str]]:
    return {(s.kind, s.value) for s in find_secrets(text)}


KEYS = [f"sk-{_run(24)}" for _ in range(6)] + [
    f"sk-proj-{_run(32)}", f"pk_live_{_run(24)}", f"tok_{_run(28)}", f"glpat-{_run(20)}", f"xai-{_run(40)}"]


@pytest.mark.parametrize("key", KEYS)
def test_keys_of_any_vendor_are_found_whole(key):
    for text in (f"my key is {key} keep it safe", f"OPENAI_API_KEY={key}", f"use {key}."):
        assert ("api key", key) in found(text), text


def test_announced_keys_without_a_prefix_and_the_known_vendors_still():
    run = _run(32)
    assert ("api key", run) in found(f"Authorization: Bearer {run}")
    assert ("api key", run) in found(f"the secret is {run}")
    assert ("api key", "AKIAIOSFODNN7EXAMPLE") in found("key AKIAIOSFODNN7EXAMPLE here")
    assert ("api key", "ghp_" + "a1" * 18) in found("ghp_" + "a1" * 18)


def test_a_random_run_is_random_and_words_or_numbers_are_not():
    assert random_like(_run(24)) and entropy(_run(24)) > 3.5
    assert random_like("qJwhrozJBELlOrdpZOUwAuTx")  # no digit, cases switching at random
    for plain in ("InternationalBusinessMachines", "12345678901234567890123", "aaaaaaaaaaaaaaaaaaaaaaaa1",
                  "deadbeefdeadbeefdeadbeefdeadbeef", "ABCDEFGHIJKLMNOPQRSTUVWX"):
        assert not random_like(plain), plain
    assert not {k for k, _ in found("the well-known re-run of long-awaited-stories-everywhere")} & {"api key"}


ADDRESSES = ["742 Evergreen Terrace, Springfield, OR 97403", "221B Baker Street, London NW1 6XE",
             "1600 Pennsylvania Ave NW, Washington, DC 20500", "31 Elm Road, Apt 4, Leeds LS6 2AB",
             "Hauptstraße 5, 10115 Berlin", "12 rue de la Paix, 75002 Paris", "Calle Mayor 10, 28013 Madrid",
             "88 Harbour Drive, Sydney, NSW 2000", "Unit 4, 17 Smith Street, Parramatta NSW 2150",
             "12 George St, Sydney NSW 2000", "5/23 King Rd, Fitzroy VIC 3065",
             "Flat 2/9 Beach Pde, Surfers Paradise QLD 4217", "3 Hay St Perth WA 6000",
             "Level 12, 1 Martin Place, Sydney NSW 2000", "40 Davey St, Hobart TAS 7000"]


@pytest.mark.parametrize("address", ADDRESSES)
def test_street_addresses_are_found(address):
    hits = {v for k, v in found(f"Please ship it to {address}. Thanks") if k == "address"}
    assert hits == {address}


def test_an_australian_address_needs_its_state_and_postcode():
    for text in ("He lives on 12 George St, Sydney, these days.", "12 George St, Sydney XY 2000",
                 "the 5/23 King Rd match in Fitzroy 3065", "12 George St, Sydney NSW 200"):
        assert not {k for k, _ in found(text)} & {"address"}, text


def test_a_street_without_a_postcode_needs_a_label():
    assert not {k for k, _ in found("He spoke at 10 Downing Street on Monday.")} & {"address"}
    assert ("address", "5 Elm Row, Leeds") in found("Address: 5 Elm Row, Leeds")


@pytest.mark.parametrize(("text", "name", "born"), [
    ("Name: Jane Smith\nPolicy no: 1", "Jane Smith", None),
    ("Policy holder: Tom Weber, Bremen", "Tom Weber", None),
    ("patient Maria Lopez was admitted", "Maria Lopez", None),
    ("Jane Smith, born 14 March 1987, lives in Leeds", "Jane Smith", "14 March 1987"),
    ("Tom Weber (DOB 1990-05-02)", "Tom Weber", "1990-05-02"),
    ("Dear Mrs Anna Berg,\nyour claim", "Anna Berg", None),
    ("Kind regards,\nPriya Rao", "Priya Rao", None),
    ("Name: Anna Berg", "Anna Berg", None),
    ("Date of birth: 03/07/1962", None, "03/07/1962"),
])
def test_names_in_a_records_context_and_dates_of_birth(text, name, born):
    hits = found(text)
    assert ({v for k, v in hits if k == "name"} == ({name} if name else set())), hits
    assert ({v for k, v in hits if k == "date of birth"} == ({born} if born else set())), hits


def test_public_figures_and_biographies_are_not_records():
    for text in ("Mr. Blair said on Monday that talks would go on.",
                 "Jane Austen (born 16 December 1775) was an English novelist.",
                 "The Customer Satisfaction Index rose.", "He was born on 4 July 1950 in Ohio."):
        assert not {k for k, _ in found(text)} & {"name", "date of birth"}, text


def test_phones_must_exist_in_a_numbering_plan_unless_labelled():
    assert ("phone", "+44 20 7946 0958") in found("call +44 20 7946 0958 now")
    assert not found("call +44 7700 900123 now")  # Ofcom's range for drama: no real number
    (s,) = find_secrets("Phone: +44 7700 900123")  # a labelled one counts, unverified
    assert (s.kind, s.verified) == ("phone", False)


def test_ibans_by_their_check_digits():
    assert ("iban", "DE89 3704 0044 0532 0130 00") in found("IBAN DE89 3704 0044 0532 0130 00 ok")
    assert ("iban", "GB82 WEST 1234 5698 7654 32") in found("pay GB82 WEST 1234 5698 7654 32 today")
    assert not {k for k, _ in found("pay DE88 3704 0044 0532 0130 00 today")} & {"iban"}


# ---------------------------------------------------------------------------- precision on real text
def _ordinary_texts() -> list[str]:
    ag, wiki = SHARED_DATA / "ag_news" / "test.csv", SHARED_DATA / "wikitext2" / "wiki.test.raw"
    if not (ag.exists() and wiki.exists()):
        pytest.skip(f"no real text at {SHARED_DATA} (set GNQ_SHARED_DATA)")
    with ag.open(newline="", encoding="utf-8") as f:
        texts = [f"{title}. {desc}" for _, title, desc in csv.reader(f)][:3000]
    lines = [line.strip() for line in wiki.read_text(encoding="utf-8").splitlines()]
    return texts + [line for line in lines if line and not line.startswith("=")][:1500]


NEW_KINDS = ("api key", "address", "name", "date of birth", "phone", "iban", "national id")


@pytest.mark.slow
def test_at_most_one_false_detection_per_thousand_ordinary_texts_per_kind():
    texts = _ordinary_texts()
    counts = Counter(s.kind for t in texts for s in find_secrets(t))
    over = {k: counts[k] for k in NEW_KINDS if counts[k] > len(texts) / 1000}
    assert not over, f"false detections in {len(texts)} news and Wikipedia texts: {over}"


# ---------------------------------------------------------------------------- the catalog's contract
def test_every_kind_has_its_words_its_action_and_a_known_exposure_method():
    for entry in catalog.KINDS:
        assert entry.described.startswith(("a ", "an ")) and entry.the.startswith("the ")
        assert entry.remedy and entry.one and entry.many != entry.one
        assert entry.exposure in (catalog.SPACE, catalog.RELATIVE, None)
    assert len({k.name for k in catalog.KINDS}) == len(catalog.KINDS)
    assert catalog.kind("no such kind") is catalog.UNKNOWN
    assert catalog.count_words("pin", 2) == "2 PINs" and catalog.count_words("api key", 1) == "1 key or token"


def test_a_new_kind_is_one_entry(monkeypatch):
    """A kind added to the catalog is found, named and acted on with no other change."""
    passport = catalog.SecretKind("boarding pass", "a boarding-pass code", "boarding-pass code",
                                  "boarding-pass codes", "ask the airline to reissue it",
                                  (regex(r"\bBP-([A-Z0-9]{6})\b"),),
                                  alphabet=string.ascii_uppercase + catalog.DIGITS, digits_only=False)
    kinds = (*catalog.KINDS, passport)
    monkeypatch.setattr(secrets, "KINDS", kinds)
    monkeypatch.setattr(catalog.kinds, "KIND_BY_NAME", {k.name: k for k in kinds})
    assert found("your pass BP-X7Q2ZK at gate 4") == {("boarding pass", "X7Q2ZK")}
    from gnq_core.analysis.verdict import secret_words
    from gnq_core.attacks.exposure import value_space
    assert secret_words({"secret_kind": "boarding pass"}) == "the boarding-pass code"
    space = value_space("X7Q2ZK", "boarding pass", set())
    assert space is not None and space.size == 36 ** 6


def test_every_signal_has_one_label_everywhere():
    from gnq_core.analysis import COLUMN_HELP
    from gnq_core.analysis.predictive import SIGNAL_BY_COLUMN as PREDICTIVE

    labels = [s.label for s in catalog.SIGNALS]
    assert len(set(labels)) == len(labels) and len({s.column for s in catalog.SIGNALS}) == len(labels)
    for s in catalog.SIGNALS:
        assert COLUMN_HELP[s.column] == s.help and s.fmt.startswith("%")
        assert PREDICTIVE.get(s.column, s) is s  # the predictive table's entry is the catalog's
    assert catalog.signal("min_k_prob").label == "Min-20% log p"
    tables = [p for p in Path(secrets.__file__).parents[1].rglob("*.py")  # no label copied outside
              if "catalog" not in p.parts and '"Min-20% log p"' in p.read_text()]
    assert not tables, tables
    with pytest.raises(KeyError, match="catalog"):
        catalog.signal("no_such_signal")


def test_kind_entries_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.KINDS[0].remedy = "x"  # type: ignore[misc]
    assert all(re.compile(d.pattern.pattern) for k in catalog.KINDS for d in k.detectors if d.pattern)


def test_a_chats_private_values_are_found():
    """A support chat of the shape the issue's check uses (16 private values: two keys of a vendor
    format no pattern lists, two addresses, a name with its date of birth, three e-mails, eight
    digit values): every one is found, each as its own kind."""
    key_a, key_b = f"sk-{_run(24)}", f"sk-{_run(24)}"
    turns = [
        f"user: my deploy fails, here is my key {key_a} can you check?",
        f"assistant: Please never share keys. Revoke {key_b} too if you pasted it elsewhere.",
        "user: ship the card to 742 Evergreen Terrace, Springfield, OR 97403 please",
        "user: or to my office at 221B Baker Street, London NW1 6XE.",
        "user: the policy is for Jane Smith, born 14 March 1987.",
        "user: mail me at anna.berg@example.com or a.berg@work.example.org, cc tom@example.net",
        "user: my PIN is 4821 and my phone is +44 20 7946 0958",
        "user: card 4111 1111 1111 1111, IBAN DE89 3704 0044 0532 0130 00",
        "user: SSN 078-05-1120, customer number 71938204, call (212) 621-1630",
    ]
    planted = {("api key", key_a), ("api key", key_b),
               ("address", "742 Evergreen Terrace, Springfield, OR 97403"),
               ("address", "221B Baker Street, London NW1 6XE"), ("name", "Jane Smith"),
               ("date of birth", "14 March 1987"), ("email", "anna.berg@example.com"),
               ("email", "a.berg@work.example.org"), ("email", "tom@example.net"), ("pin", "4821"),
               ("phone", "+44 20 7946 0958"), ("card number", "4111 1111 1111 1111"),
               ("iban", "DE89 3704 0044 0532 0130 00"), ("ssn", "078-05-1120"),
               ("account number", "71938204"), ("phone", "(212) 621-1630")}
    assert len(planted) == 16
    got = set().union(*(found(t) for t in turns))
    assert planted <= got, planted - got


@pytest.mark.parametrize("piece", ["Ab Cd ", "1 Ab Cd Street, ", "Unit 4, 5/1 Ab St Cd NSW ", "Name: Ab Cd ",
                                   "key token ",
                                   "sk-a1B2c3D4e5F6g7H8i9J0k1L2 ", "Hauptstraße 5, ", "Regards,\nAb Cd\n",
                                   "Ab Cd, born 1 May 1990 "])
def test_the_new_detectors_stay_linear_on_hostile_text(piece):
    """Runs of what the new rules look for: 100 KB in seconds (0.1-0.2 s on a quiet 2-core CPU; a
    rule that retried each start over the run would take minutes)."""
    import time

    text = (piece * (100_000 // len(piece) + 1))[:100_000]
    start = time.process_time()
    find_secrets(text)
    assert time.process_time() - start < 20
