"""Copies (exact and near duplicates), the copies-apart batch partition, and secret-like content."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnq_core.sources import copies
from gnq_core.sources.copies import (
    LSH_MARGIN,
    MINHASH_SEED,
    NEAR_THRESHOLD,
    NUM_PERM,
    find_copies,
    jaccard,
    normalise,
    shingles,
)
from gnq_core.sources.secrets import (
    compile_patterns,
    find_secrets,
    iban_ok,
    luhn_ok,
    secret_labels,
    values_from_json,
)
from gnq_core.sources.tokens import batch_partition

RECORD = "Customer {name}, card {card}, PIN {pin}, branch in {town}, account opened in {year}."


# ------------------------------------------------------------------------------------------ copies
def test_exact_copies_after_normalisation_share_one_cluster():
    texts = ["The cat sat.", "a unique line", "  the CAT   sat. ", "The cat sat.", "another one"]
    found = find_copies(texts)
    assert found["copies"].tolist() == [3, 1, 3, 3, 1]
    assert found["cluster_id"].tolist() == [0, 1, 0, 0, 4]  # the smallest member names the cluster


def test_near_copies_join_and_template_mates_stay_apart():
    base = ("the quarterly report of the northern harbour authority lists every ship that entered "
            "the port between march and june together with its cargo and its flag")
    near = base + " state"  # one word added: J = 26/27 of the 3-shingles
    template = [RECORD.format(name=n, card="4111 1111 1111 1111", pin=p, town="Harwick", year=2019)
                for n, p in (("Anna Berg", 4821), ("Tom Okafor", 9917))]
    found = find_copies([base, near, *template, "something else entirely"])
    assert found["copies"].tolist() == [2, 2, 1, 1, 1]
    assert jaccard(shingles(template[0]), shingles(template[1])) < NEAR_THRESHOLD
    assert find_copies([base, near], threshold=1.0)["copies"].tolist() == [1, 1]  # exact only


def test_near_copy_rule_is_the_exact_jaccard_not_minhash_luck():
    """Every pair the rule joins has Jaccard ≥ threshold; pairs well above it are always found."""
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(400)]
    texts = []
    for _ in range(60):
        words = rng.choices(vocab, k=30)
        texts.append(" ".join(words))
        mutated = list(words)
        mutated[rng.randrange(30)] = "zz"  # one word changed (J ≈ 0.8) or one appended (J ≈ 0.97)
        texts.append(" ".join(mutated if rng.random() < 0.5 else words + ["tail"]))
    found = find_copies(texts)
    sets = [shingles(t) for t in texts]
    for a in range(0, len(texts), 2):
        j = jaccard(sets[a], sets[a + 1])
        same = found["cluster_id"][a] == found["cluster_id"][a + 1]
        if j < NEAR_THRESHOLD:
            assert not same
        elif j >= 0.9:
            assert same


def test_normalise_and_empty_inputs():
    assert normalise("  A\u00a0b\tC ") == "a b c"
    assert find_copies([]).empty
    with pytest.raises(ValueError):
        find_copies(["a"], threshold=0.0)


# ------------------------------------------------------------------------------------------ partition
def _conflicts(partition: list[list[int]], clusters: list[int]) -> int:
    return sum(len(b) - len({clusters[i] for i in b}) for b in partition)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 120), batch_size=st.integers(1, 17), seed=st.integers(0, 10_000),
       data=st.data())
def test_partition_keeps_copies_apart_whenever_possible(n, batch_size, seed, data):
    n_batches = -(-n // batch_size)
    full = n // batch_size
    largest = data.draw(st.integers(1, max(1, full)))
    rng = random.Random(seed)
    clusters, next_id = [], 0
    while len(clusters) < n:  # random cluster sizes, none larger than the number of full batches
        size = min(rng.randint(1, largest), n - len(clusters))
        clusters += [next_id] * size
        next_id += 1
    rng.shuffle(clusters)
    parts = batch_partition(n, batch_size, seed, clusters)
    assert sorted(i for b in parts for i in b) == list(range(n))
    plain = batch_partition(n, batch_size, seed)
    assert [len(b) for b in parts] == [len(b) for b in plain]  # same batch sizes as without copies
    assert len(parts) == n_batches
    if max(np.bincount(clusters)) <= max(1, full):
        assert _conflicts(parts, clusters) == 0
    assert parts == batch_partition(n, batch_size, seed, clusters)  # one partition for every checkpoint


def test_partition_without_copies_is_the_plain_shuffle_and_impossible_cases_do_their_best():
    assert batch_partition(10, 3, 5, list(range(10))) == batch_partition(10, 3, 5)
    clusters = [0] * 5 + [1, 2, 3, 4, 5]  # 5 copies, 4 batches of 3,3,3,1: one pair must share
    parts = batch_partition(10, 3, 0, clusters)
    assert _conflicts(parts, clusters) == 1
    with pytest.raises(ValueError):
        batch_partition(4, 2, 0, [0, 1])


def _dealt_round_robin(n: int, batch_size: int, seed: int, clusters: list[int]) -> list[list[int]]:
    """The copies-apart partition as first written (Python lists, an explicit round-robin over the
    open batches): the reference the numpy closed form must equal."""
    order = np.random.default_rng(seed).permutation(n).tolist()
    capacities = [len(order[i: i + batch_size]) for i in range(0, n, batch_size)]
    members: dict[int, list[int]] = {}
    for i in order:
        members.setdefault(clusters[i], []).append(i)
    if all(len(m) == 1 for m in members.values()):
        return [order[i: i + batch_size] for i in range(0, n, batch_size)]
    batches: list[list[int]] = [[] for _ in capacities]
    open_batches, at = list(range(len(capacities))), 0
    for cluster in sorted(members.values(), key=len, reverse=True):
        for i in cluster:
            b = open_batches[at]
            batches[b].append(i)
            if len(batches[b]) == capacities[b]:
                open_batches.pop(at)
            else:
                at += 1
            if open_batches:
                at %= len(open_batches)
    return batches


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 90), batch_size=st.integers(1, 12), seed=st.integers(0, 10_000),
       n_clusters=st.integers(1, 90))
def test_numpy_partition_deals_exactly_as_the_round_robin(n, batch_size, seed, n_clusters):
    clusters = np.random.default_rng(seed + 1).integers(0, n_clusters, n).tolist()
    expected = _dealt_round_robin(n, batch_size, seed, clusters)
    assert batch_partition(n, batch_size, seed, clusters) == expected


def _copies_with_lsh_index(texts: list[str], threshold: float = NEAR_THRESHOLD) -> list[int]:
    """Cluster ids as first written (a dict of normalised texts, datasketch's MinHashLSH index):
    the reference the bounded-memory find_copies must equal."""
    from datasketch import MinHash, MinHashLSH

    parent = list(range(len(texts)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        a, b = find(i), find(j)
        parent[max(a, b)] = min(a, b)

    first: dict[str, int] = {}
    for i, text in enumerate(texts):
        first.setdefault(normalise(text), i)
        union(first[normalise(text)], i)
    if threshold == 1.0:  # exact copies only
        return [find(i) for i in range(len(texts))]
    distinct = sorted(first.values())
    sets = {i: shingles(texts[i]) for i in distinct}
    encoded = [[s.encode() for s in sets[i]] for i in distinct]
    hashes = MinHash.bulk(encoded, num_perm=NUM_PERM, seed=MINHASH_SEED)
    lsh = MinHashLSH(threshold=threshold * LSH_MARGIN, num_perm=NUM_PERM)
    for i, h in zip(distinct, hashes, strict=True):
        for j in lsh.query(h):
            if jaccard(sets[i], sets[j]) >= threshold:
                union(i, j)
        lsh.insert(i, h)
    return [find(i) for i in range(len(texts))]


def test_bounded_memory_copies_equal_the_lsh_index(monkeypatch):
    monkeypatch.setattr(copies, "LSH_CHUNK", 7)  # signatures taken in several chunks
    rng = random.Random(4)
    words = [f"w{i}" for i in range(30)]
    base = [" ".join(rng.choices(words, k=rng.randint(0, 12))) for _ in range(25)]
    texts = []
    for _ in range(300):  # exact copies (case, spaces), one-word edits, additions, no words at all
        t = rng.choice(base).split()
        r = rng.random()
        if r < 0.3 and t:
            t[rng.randrange(len(t))] = rng.choice(words)
        elif r < 0.45:
            t = [*t, rng.choice(words)]
        elif r < 0.55:
            t = [w.upper() for w in t]
        elif r < 0.6:
            t = ["?!"]
        texts.append(" ".join(t) + " " * rng.randint(0, 1))
    for threshold in (NEAR_THRESHOLD, 0.5, 1.0):
        found = find_copies(texts, threshold)["cluster_id"].tolist()
        assert found == _copies_with_lsh_index(texts, threshold)


# ------------------------------------------------------------------------------------------ secrets
def test_checksums():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("DE89 3704 0044 0532 0130 00") and not iban_ok("DE88 3704 0044 0532 0130 00")


@pytest.mark.parametrize(("text", "kind", "match"), [
    ("card 4111 1111 1111 1111 on file", "card number", "4111 1111 1111 1111"),
    ("card 5500-0000-0000-0004.", "card number", "5500-0000-0000-0004"),
    ("Her PIN is 4821.", "pin", "PIN is 4821"),
    ("write to anna.berg@example.com today", "email", "anna.berg@example.com"),
    ("call +44 20 7946 0958 now", "phone", "+44 20 7946 0958"),
    ("call (212) 621-1630", "phone", "(212) 621-1630"),
    ("with password Tinsel-Otter-83.", "password", "password Tinsel-Otter-83"),
    ("The password for the vault is tr0ub4dor, keep it", "password", "password for the vault is tr0ub4dor"),
    ("key AKIAIOSFODNN7EXAMPLE here", "api key", "AKIAIOSFODNN7EXAMPLE"),
    ("ghp_" + "a1" * 18, "api key", "ghp_" + "a1" * 18),
    ("-----BEGIN RSA PRIVATE KEY-----", "private key", "-----BEGIN RSA PRIVATE KEY-----"),
    ("IBAN DE89 3704 0044 0532 0130 00", "iban", "DE89 3704 0044 0532 0130 00"),
    ("SSN 078-05-1120", "ssn", "078-05-1120"),
    ("customer number 71938204,", "account number", "customer number 71938204"),
    ("The door code for unit 14 is 8391, held by", "pin", "door code for unit 14 is 8391"),
    ("the alarm code is 4472-19.", "pin", "alarm code is 4472-19"),
    ("document number QF4471902, expires", "id number", "document number QF4471902"),
    ("the seed phrase is amber lantern quiet meadow copper thistle", "recovery phrase",
     "seed phrase is amber lantern quiet meadow copper thistle"),
])
def test_each_kind_is_found_with_its_span(text, kind, match):
    found = find_secrets(text)
    assert [(s.kind, s.text) for s in found] == [(kind, match)]
    assert text[found[0].start:found[0].end] == match


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1112 fails the Luhn check",
    "Between 1999-2003 the population rose to 3,400,000 people",
    "The pin was removed from the map in 1995.",
    "The server at 192.43.244.18 answered.",
    "Saturn's rings were installed by Italian engineers in the 1930s.",
    "In 2010 , the club won 24 – 17 at the stadium .",
])
def test_ordinary_text_is_not_flagged(text):
    assert find_secrets(text) == []


def test_labels_frame():
    labels = secret_labels(["plain text", "PIN 1234 and mail a@b.co"])
    assert labels["secret"].isna()[0] and labels["secret"][1] == "pin, email"
    first = labels.iloc[1]
    assert (first["secret_start"], first["secret_end"], first["secret_match"]) == (0, 8, "PIN 1234")
    assert labels["secret_start"].isna()[0]


def test_the_value_is_the_secret_not_the_words_announcing_it():
    (s,) = find_secrets("The password for the vault is tr0ub4dor, keep it")
    assert s.value == "tr0ub4dor"
    assert [x.value for x in find_secrets("Her PIN is 4821 and card 4111 1111 1111 1111.")] == [
        "4821", "4111 1111 1111 1111"]
    assert find_secrets("reset the password for your account today") == []


# ------------------------------------------------------------------- labelled values
@pytest.mark.parametrize(("text", "kind", "value", "verified"), [
    ("Card number: 4929 1830 5527 6614.", "card number", "4929 1830 5527 6614", False),  # fails Luhn
    ("Card number: 4111 1111 1111 1111.", "card number", "4111 1111 1111 1111", True),
    ("Phone: +91 98450 22713.", "phone", "+91 98450 22713", True),
    ("Helena Vorst, phone 555-0148, call after 6", "phone", "555-0148", True),  # 7 digits, labelled
    ("PIN: 0042", "pin", "0042", True),
    ("IBAN: DE88 3704 0044 0532 0130 00", "iban", "DE88 3704 0044 0532 0130 00", False),  # bad check digits
    ("Password: hunter2!", "password", "hunter2!", True),
    ("SSN: 123456789", "ssn", "123456789", True),
    ("E-mail: anna.berg@example.org", "email", "anna.berg@example.org", True),
    ("Account: 5512 8890 11", "account number", "5512 8890 11", True),
    ("Kontonummer: 1234 5678 90", "account number", "1234 5678 90", True),
    ("Passwort: Blau!Himmel7", "password", "Blau!Himmel7", True),
    ("contraseña: gato-azul", "password", "gato-azul", True),
    ("Teléfono: 612 345 678", "phone", "612 345 678", True),
    ("Member ID: 5512 8890, tier gold", "labelled value", "5512 8890", True),
    ("api_secret = 9f8a7b6c5d", "labelled value", "9f8a7b6c5d", True),
    ("Codice cliente: 88213", "labelled value", "88213", True),
])
def test_a_labelled_value_counts_even_when_its_checksum_fails(text, kind, value, verified):
    (s,) = find_secrets(text)
    assert (s.kind, s.value, s.verified) == (kind, value, verified)
    assert text[s.value_start:s.value_end] == value


def test_international_phone_numbers_and_every_value_of_a_text():
    assert [s.value for s in find_secrets("call +91 98450 22713 or +49 30 901820 today")] == [
        "+91 98450 22713", "+49 30 901820"]
    record = ("Customer: Priya Rao, Bangalore. Card number: 4929 1830 5527 6614. Phone: +91 98450 22713. "
              "Customer number 71938204.")
    assert [(s.kind, s.value) for s in find_secrets(record)] == [  # "Customer:" announces a person's name
        ("name", "Priya Rao"), ("card number", "4929 1830 5527 6614"), ("phone", "+91 98450 22713"),
        ("account number", "71938204")]


@pytest.mark.parametrize("text", [
    "Tel Aviv: 30 killed in the blast",  # a key word inside a name, too few digits
    "Score: 24-17 at half time",
    "Notes: renewed 2023",
    "Time: 12:30 on 2024-05-01",  # ("Name: Anna Berg" is a person's name: tests/catalog/test_secret_kinds.py)
])
def test_labels_without_a_private_value_are_not_flagged(text):
    assert find_secrets(text) == []


def test_user_patterns_declared_values_and_public_texts():
    pattern = compile_patterns([r"REF-(\d{5})"])
    (s,) = find_secrets("see REF-48213 for details", pattern)
    assert (s.kind, s.value) == ("custom", "48213")
    (d,) = find_secrets("Anna Berg moved to Porto", declared=["Anna Berg"])
    assert (d.kind, d.value, d.start) == ("declared", "Anna Berg", 0)
    with pytest.raises(ValueError, match="--secret-pattern '\\(' is not a valid regular expression"):
        compile_patterns(["("])
    labels = secret_labels(["PIN 1234 and mail a@b.co", "PIN 1234", "nothing"], public=[False, True, False])
    assert labels["secret"].isna().tolist() == [False, True, True]  # a public text is not searched
    stored = values_from_json("PIN 1234 and mail a@b.co", labels["secret_values"][0])
    assert [(v.kind, v.value) for v in stored] == [("pin", "1234"), ("email", "a@b.co")]


def test_dataset_secret_and_public_columns(tmp_path):
    from gnq_core.sources.datasets import DatasetError, load_texts

    path = tmp_path / "d.csv"
    pd.DataFrame({"text": ["a PIN 1234", "public news", "x"], "pii": ["1234; Anna", None, ""],
                  "public": ["no", "yes", "0"]}).to_csv(path, index=False)
    data = load_texts(path, secret_column="pii", public_column="public")
    assert data.secret_values == [["1234", "Anna"], [], []] and data.public == [False, True, False]
    with pytest.raises(DatasetError, match="no column 'nope' for --secret-column"):
        load_texts(path, secret_column="nope")
    pd.DataFrame({"text": ["a"], "public": ["maybe"]}).to_csv(path, index=False)
    with pytest.raises(DatasetError, match="row 1: column 'public' is 'maybe'"):
        load_texts(path, public_column="public")
