"""Regular expressions on untrusted input run with a bound: the secret-like scan is linear in the
text (a hyphenated run "ab-ab-ab-…" made the e-mail pattern retry every word boundary), the
format check linear in the number of values, and an adapter's patterns (PEFT reads a string
target_modules as a regex) are checked in a worker process with a time limit."""

from __future__ import annotations

import random
import re
import time

import pytest

from gnq_core.sources.secrets import find_secrets

# The regexes the scans replace: the reference their matches must equal.
JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")
EMAIL = re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")
HOSTILE = ["ab-", "a.", "eyJa-", "eyJaaaaaaaa.eyJa-", "x@", "a-@b", "pin: 1234 key: 12345 ",
           "PIN 1234 pin: 5678 ", "token: aaaaaaaaaaaaaaaaaaaa "]


@pytest.mark.parametrize("piece", HOSTILE)
def test_the_secret_scan_is_linear_in_the_text(piece):
    """200 KB of a repeated piece: seconds at most (the e-mail pattern took ~30 s on "ab-" of this size,
    the JWT pattern and the check of generic values against the known kinds grew as its square)."""
    text = (piece * (200_000 // len(piece) + 1))[:200_000]
    start = time.perf_counter()
    find_secrets(text)
    assert time.perf_counter() - start < 5


def test_the_scans_find_what_the_regexes_found():
    pieces = ["a", "Z", "1", "_", "-", ".", "@", "%", "+", " ", "é", "ß", "eyJ", "eyJhbGciOi", "x@y.com",
              ".com", "co", "\n", "jo.doe", "@ex-ample.org", "é@x.de", "-a", "_a",
              "eyJabcdefgh.eyJabcdefghi.abcdefghij"]
    rng = random.Random(0)
    seen = {"api key": 0, "email": 0}
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 20)))
        every = [(s.kind, s.start, s.end) for s in find_secrets(text)]
        # the JWT-shaped keys and the e-mails: the generic key rule (a prefix or keyword before a
        # random-looking run) reports keys of other shapes too, tested in test_secret_kinds.py
        found = {t for t in every if t[0] == "email" or (t[0] == "api key" and text.startswith("eyJ", t[1]))}
        expected = {("api key", m.start(), m.end()) for m in JWT.finditer(text)} | {
            ("email", m.start(), m.end()) for m in EMAIL.finditer(text)}
        # what survived the overlaps is a regex match, and a regex match no other match overlaps survived
        assert found <= expected, text
        alone = {t for t in expected if not any(o != t and o[1] < t[2] and t[1] < o[2] for o in every)}
        assert alone <= found, text
        for kind, *_ in found:
            seen[kind] += 1
    assert min(seen.values()) > 100


def test_the_format_of_many_values_is_counted_once():
    """``format_places`` for each of 4,000 values of one kind took 39 s (each against all the others);
    counted once for all: milliseconds, the same places."""
    from gnq_core.attacks.secret_attack import format_places, format_places_of

    rng = random.Random(1)
    values = {f"+44 20 7946 {rng.randrange(10_000):04d}" for _ in range(4000)}
    start = time.perf_counter()
    places = format_places_of(values)
    assert time.perf_counter() - start < 2
    for v in sorted(values)[:20]:
        assert places[v] == format_places(v, sorted(values - {v}))
    assert places[next(iter(values))] >= set(range(8))  # "+44 20 7946": the format


def test_a_page_answers_within_2_s_while_another_session_counts_values(tmp_path, monkeypatch):
    """New audit counts a dataset's secret-like values in the server process.  A 150 KB text of
    "ab-ab-…" made one search of the e-mail pattern run for seconds, holding the interpreter, and no
    other session's page answered; now each search is short, and another session's page answers
    within 2 s while the values are counted."""
    import threading

    from hostile_helpers import ROOT, app_page
    from streamlit.testing.v1 import AppTest

    data = tmp_path / "texts.txt"
    data.write_text("".join(f"PIN 48{i:02d} " + "ab-" * 50_000 + "\n" for i in range(4)), encoding="utf-8")
    monkeypatch.setenv("GNQ_DB", str(tmp_path / "gnq.duckdb"))
    app_page("runs")  # the other session's page, once before: its imports are not what is measured
    counting = AppTest.from_file(str(ROOT / "gnq_core" / "dashboard" / "views" / "new_audit.py"),
                                 default_timeout=300)
    counting.run()
    counting.radio(key="data_mode").set_value("Local path").run()
    field = counting.text_input(key="data_path_input")
    typed = threading.Thread(target=lambda: field.set_value(str(data)).run())
    typed.start()
    took = []
    while typed.is_alive():
        start = time.monotonic()
        assert not app_page("runs").exception
        took.append(time.monotonic() - start)
    typed.join()
    assert took and max(took) < 2, took
    assert "4 secret-like values in 4 texts" in "\n".join(c.value for c in counting.caption)
