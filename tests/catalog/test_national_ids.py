"""National identity numbers (catalog/national_ids.py): recall on valid numbers of every scheme,
generated here or taken from python-stdnum's documented examples, in sentences of their
languages; a labelled value whose check fails is a national id unverified, an unlabelled digit
run none; the candidate space recomputes the check digits of the digit-only schemes; precision on
ordinary text is test_secret_kinds.py's bound (at most 1 false detection per 1,000 texts)."""

from __future__ import annotations

import random
import string

import pytest
from stdnum import luhn, verhoeff
from stdnum.es import dni, nie
from stdnum.fr import nir
from stdnum.iso7064 import mod_11_10
from stdnum.it import codicefiscale

from gnq_core import catalog
from gnq_core.attacks.exposure import value_space
from gnq_core.catalog.national_ids import id_check_fill, id_ok, labelled_id_ok, nino_ok
from gnq_core.sources.secrets import find_secrets
from gnq_core.sources.surrogates import surrogate

_RNG = random.Random(71)


def _digits(n: int, first: str = string.digits) -> str:
    return _RNG.choice(first) + "".join(_RNG.choice(string.digits) for _ in range(n - 1))


def _eleven_test(weights: tuple[int, ...], n: int) -> str:
    """A random number whose weighted digit sum is 0 mod 11 (BSN, TFN): redrawn until one is."""
    while True:
        number = _digits(n, "123456789")
        if sum(w * int(d) for w, d in zip(weights, number, strict=True)) % 11 == 0:
            return number


def _steuer_id() -> str:
    while True:  # the first ten digits: one digit twice, the others once (stdnum's rule), no leading 0
        nine = _RNG.sample(string.digits, 9)
        body = "".join(_RNG.sample(nine + [nine[0]], 10))
        if body[0] != "0":
            return body + mod_11_10.calc_check_digit(body)


def _nir() -> str:
    body = _RNG.choice("12") + _digits(2) + f"{_RNG.randint(1, 12):02d}" + _digits(8)
    return body + nir.calc_check_digits(body)


def _codice_fiscale() -> str:
    letters = "".join(_RNG.choice(string.ascii_uppercase) for _ in range(6))
    body = (letters + _digits(2) + _RNG.choice("ABCDEHLMPRST") + f"{_RNG.randint(1, 28):02d}"
            + _RNG.choice("ABCDEFGHILM") + _digits(3))
    return body + codicefiscale.calc_check_digit(body)


def _nie() -> str:
    body = _RNG.choice("XYZ") + _digits(7)
    return body + nie.calc_check_digit(body)


def _grouped(number: str, sizes: tuple[int, ...], sep: str = " ") -> str:
    out, i = [], 0
    for size in sizes:
        out.append(number[i:i + size])
        i += size
    return sep.join(out)


def _sin() -> str:
    body = _digits(8, "1234567")
    return _grouped(body + luhn.calc_check_digit(body), (3, 3, 3), _RNG.choice(" -"))


def _aadhaar() -> str:
    body = _digits(11, "23456789")
    return _grouped(body + verhoeff.calc_check_digit(body), (4, 4, 4))


def _dni() -> str:
    body = _digits(8)
    return f"{body}-{dni.calc_check_digit(body)}"


# (a sentence with {} for the value, a generator of valid values, stdnum's documented valid example,
#  a label of a record: "label: value")
SCHEMES = {
    "uk nino": ("Your National Insurance number: {} is on your payslip.",
                lambda: _RNG.choice("ABCEHJ") + _RNG.choice("ABCEHJ") + _digits(6) + _RNG.choice("ABCD"),
                "QQ 12 34 56 C", "NI number"),
    "de steuer-id": ("Ihre Steueridentifikationsnummer lautet {} (bitte aufbewahren).", _steuer_id,
                     "36 574 261 809", "Steuer-ID"),
    "fr nir": ("Mon numéro de sécurité sociale est {}, merci.", _nir, "2 95 10 99 126 111 93", "NIR"),
    "es dni": ("Adjunto mi DNI {} para el contrato.", _dni, "54362315-K", "DNI"),
    "es nie": ("El NIE del inquilino es {}.", _nie, "X-2482300W", "NIE"),
    "it codice fiscale": ("Il mio codice fiscale è {} grazie.", _codice_fiscale, "RCCMNL83S18D969H",
                          "Codice fiscale"),
    "nl bsn": ("Mijn BSN is {} en mijn adres volgt.", lambda: _eleven_test((9, 8, 7, 6, 5, 4, 3, 2, -1), 9),
               "1112.22.333", "Burgerservicenummer"),
    "in aadhaar": ("Please update Aadhaar no. {} in the bank records.", _aadhaar, "2341 2341 2346",
                   "Aadhaar"),
    "ca sin": ("My social insurance number is {} for the T4.", _sin, "123-456-782", "SIN"),
    "au tfn": ("Quote your TFN {} on the form.",
               lambda: _eleven_test((1, 4, 3, 7, 5, 8, 6, 9, 10), 9), "123 456 782", "Tax file number"),
}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_valid_numbers_of_every_scheme_are_found_verified_in_their_sentences(scheme):
    sentence, generate, documented, label = SCHEMES[scheme]
    values = [documented] + [generate() for _ in range(20)]
    if scheme == "uk nino":  # HMRC's administrative prefix QQ is no person's; stdnum has no NINO
        values = [v for v in values if nino_ok(v)]
        assert len(values) == 20
    for value in values:
        for text in (sentence.format(value), f"{label}: {value}"):
            hits = [(s.kind, s.value, s.verified) for s in find_secrets(text)]
            assert ("national id", value, True) in hits, (text, hits)
        assert id_ok(value)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_a_labelled_value_whose_check_fails_is_a_national_id_but_unverified(scheme):
    """Every value with one digit changed (each such change breaks these checks, or leaves a
    format the scheme does not allow): found by its label, never verified."""
    sentence, generate, _, label = SCHEMES[scheme]
    if scheme == "uk nino":  # no check digit: a prefix never issued fails HMRC's rules instead
        bad = ["GB 12 34 56 A", "DF123456A", "AO123456B"]
    else:
        bad = []
        for _ in range(20):
            value = generate()
            i = max(i for i, c in enumerate(value) if c.isdigit())  # a check digit or a body digit
            bad.append(value[:i] + str((int(value[i]) + _RNG.randint(1, 9)) % 10) + value[i + 1:])
    for value in bad:
        assert not labelled_id_ok(label, value), value  # (it may be valid in another scheme)
        hits = [(s.kind, s.value, s.verified) for s in find_secrets(sentence.format(value))]
        assert ("national id", value, True) not in hits, (value, hits)
        hits = [(s.kind, s.value, s.verified) for s in find_secrets(f"{label}: {value}")]
        assert hits == [("national id", value, False)], (value, hits)


def test_random_labelled_digit_runs_are_never_verified():
    """1,000 random 9-digit runs after "BSN": the 11-test passes about 1 in 11 and those are found
    verified; every other one is unverified (a checksum-verified one is never a failing value)."""
    verified = 0
    for _ in range(1000):
        run = _digits(9, "123456789")
        (s,) = [s for s in find_secrets(f"BSN: {run}") if s.kind == "national id"]
        ok = sum(w * int(d) for w, d in zip((9, 8, 7, 6, 5, 4, 3, 2, -1), run, strict=True)) % 11 == 0
        assert s.verified == ok, run
        verified += ok
    assert 50 < verified < 150


def test_valid_numbers_without_a_label_are_not_taken_unless_their_format_is_distinctive():
    for value in ("2 95 10 99 126 111 93", "123 456 782", "36574261809", "2341 2341 2346", "54362315-K"):
        kinds = {s.kind for s in find_secrets(f"The order {value} shipped on Monday.")}
        assert "national id" not in kinds, value
    for value in ("RCCMNL83S18D969H", "X-2482300W"):
        assert ("national id", value) in {(s.kind, s.value) for s in find_secrets(f"ref {value} attached")}
    assert not {s.kind for s in find_secrets("Sin 123 456 782 was the score.")} & {"national id"}


def test_a_label_names_its_scheme_and_a_generic_one_any():
    assert labelled_id_ok("SIN ", "130 692 544") and not labelled_id_ok("BSN ", "130692544")
    assert labelled_id_ok("national ID number ", "130692544")  # valid as a SIN only
    (s,) = find_secrets("BSN: 130692544")
    assert (s.kind, s.verified) == ("national id", False)
    (s,) = find_secrets("national ID number 130692544")
    assert (s.kind, s.verified) == ("national id", True)
    (s,) = find_secrets("national ID number 130692549")  # fails every check: the document-number kind
    assert s.kind == "id number"
    assert catalog.kind("id number").name == "id number"  # stored kind names keep reading


def test_the_candidate_space_recomputes_the_check_digits_it_can():
    rng = random.Random(0)
    for value, n_check in (("123-456-782", 1), ("36 574 261 809", 1), ("2341 2341 2346", 1),
                           ("2 95 10 99 126 111 93", 2)):
        space = value_space(value, "national id", set())
        digits = sum(c.isdigit() for c in value)
        assert space is not None and space.size == 10 ** (digits - n_check), value
        assert space.template.endswith("#" * n_check)
        drawn = [space.random(rng) for _ in range(50)]
        assert all(space.allows(v) and id_check_fill(v) == v for v in drawn)
    # a BSN's 11-test leaves bodies without a check digit: every digit free (this one fails Luhn)
    assert value_space("1112.22.333", "national id", set()).size == 10 ** 9
    assert value_space("RCCMNL83S18D969H", "national id", set()) is None  # letters: no digit space


def test_surrogates_keep_the_check_digits():
    rng = random.Random(1)
    for _ in range(100):
        new = surrogate("national id", "2341 2341 2346", rng)
        assert new != "2341 2341 2346" and len(new) == 14 and verhoeff.is_valid(new.replace(" ", ""))


@pytest.mark.parametrize("piece", ["BSN ", "Steuer-ID: 1 ", "NIR 1 84 ", "national ID number ",
                                   "RCCMNL83S18D9"])
def test_the_detector_stays_linear_on_hostile_text(piece):
    import time

    text = (piece * (100_000 // len(piece) + 1))[:100_000]
    start = time.process_time()
    find_secrets(text)
    assert time.process_time() - start < 20
