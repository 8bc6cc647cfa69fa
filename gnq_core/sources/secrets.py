"""Secret- and PII-like content in a text: card numbers, PINs, passwords and recovery phrases,
keys and tokens, IBANs, account, passport and social-security numbers, national identity and tax
numbers, phone numbers, e-mail addresses, street addresses, names and dates of birth.

Offline patterns, no model, every one from the catalog's entry for its kind
(gnq_core/catalog/kinds.py): each kind is a regular expression or a scan plus, where the format
has one, its checksum (Luhn for card numbers, ISO 7064 mod 97 for IBANs, each national identity
number's own), so a random 16-digit number is not called a card.  The key and token shapes are
the published formats of their issuers (AWS access keys, GitHub, Slack and Stripe tokens, Google
API keys, JSON Web Tokens, PEM private keys) as used by detect-secrets and gitleaks; a password,
PIN or recovery phrase is recognised by the words that announce it ("PIN 4821", "password: ...",
"customer number ...").  What a pattern cannot know (a name, an address) is not claimed: the
label means "looks like a secret".

**Labelled values**: a value after a label and a colon, "=" or "is" ("Card number:
4929 1830 5527 6614", "Phone: +91 98450 22713", "Passwort: ...", and any "key: value" whose key
names something private, in several languages) is a secret of the label's kind even when its
checksum fails, as made-up and test numbers do: such a match has ``verified=False``.  What the
user knows and the tool cannot: ``extra_patterns`` (``--secret-pattern``, kind "custom": the
regex's group named ``value``, else its first other group, else its whole match, is the value;
a group named ``free`` marks the value's characters that vary, the rest being its format) and
``declared`` values
(``--secret-column``: the row's private value(s), found where they occur in its text, kind
"declared").

``find_secrets(text)`` lists every match (kind, start, end, matched string) in text order,
overlaps resolved in favour of the earlier, then longer match; ``secret_labels(texts)`` gives
the per-text label the store keeps: the kinds found, the first match's span, and every match
(``secret_values``, JSON) for the secret attack to probe, each one.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gnq_core.catalog import KINDS, iban_ok, luhn_ok  # noqa: F401  (luhn_ok, iban_ok: their old home)

SECRET_COLUMNS = ["secret", "secret_start", "secret_end", "secret_match", "secret_values"]
GENERIC = "labelled value"  # a value after any secret-like key


@dataclass(frozen=True)
class SecretMatch:
    """One match: ``start``/``end``/``text`` span the whole match with the words announcing it
    ("PIN is 4821"); ``value_start``/``value_end`` the secret itself ("4821"), what an attack
    must reproduce and what to scrub."""

    kind: str
    start: int
    end: int
    text: str
    value_start: int = -1
    value_end: int = -1
    verified: bool = True  # False: found by its label alone, its checksum fails (card, IBAN)
    # a user pattern's group named ``free``: the characters of the value that vary from value to value
    # (the rest is its format, kept in every candidate when exposure ranks it); -1: not named
    free_start: int = -1
    free_end: int = -1

    @property
    def value(self) -> str:
        return self.text[self.value_start - self.start: self.value_end - self.start]


# ------------------------------------------------------------------------------ labelled values
# "label: value": the label names the kind (the catalog's ``label_words``); a colon, "=", "#" or "is"
# announces the value.
_LABEL_TAIL = r"\s*(?:[:=#]|\s(?:is|was|ist|es|est)\b)\s*"
# a phone number needs no colon after its label ("phone 555-0148"); a card number does ("card 4111
# 1111 1111 1112" is a random number that fails its checksum, "Card number: ..." is a card)
_LOOSE_TAIL = r"\s*(?:[:=#]|\s(?:is|was)\b|\s(?=[+(\d]))\s*"
_LABELLED = [(k, re.compile(r"(?i)(?<![\w@])(?:" + k.label_words + r")"
                            + (_LOOSE_TAIL if k.loose_label else _LABEL_TAIL)
                            + r"(?-i:" + k.label_value + ")"))
             for k in KINDS if k.label_words and k.label_value]
# any "key: value" whose key names something private; the value holds 4 digits, or follows a
# password-like key
_SECRET_KEY_WORDS = (r"secret|token|api[ _-]?key|private[ _-]?key|key|pass\w*|pwd|pin|code|ssn|iban|"
                     r"bic|swift|"
                     r"account|acct|card|cvv|cvc|phone|tel|mobile|e-?mail|passport|licen[cs]e|"
                     r"id|dob|birth\w*|salary|routing|tax|vat|insurance|"
                     r"geheim\w*|schl[üu]ssel|kennwort|konto\w*|karte|ausweis|steuer\w*|"
                     r"clave|secreto|cuenta|tarjeta|contrase[ñn]a|documento|"
                     r"cl[ée]|compte|carte|num[ée]ro|nummer|n[úu]mero|codice|chiave|"
                     r"senha|conta|cart[ãa]o|wachtwoord|rekening|sleutel")
_KEY_VALUE = re.compile(r"(?im)(?:^|(?<=[\s,;({\[\"']))"
                        r"([A-Za-zÀ-ÿ][\wÀ-ÿ '/-]{0,30}?)\s*[:=]\s*(?![a-z]+://)"
                        r"(\+?\(?\d[\d()]*(?:[ ./-]\(?\d[\d()]*)*(?![\w@])"
                        r"|[^\s,;\"'}\]]*\d[^\s,;\"'}\]]*[^\s,;.\"'}\]]|[^\s,;\"'}\]]{6,})")
_KEY_WORDS = re.compile(r"(?i)(?<![a-zà-ÿ])(?:" + _SECRET_KEY_WORDS + r")(?![a-zà-ÿ])")
_PASSWORDISH = re.compile(r"(?i)pass|pwd|secret|token|key|clave|senha|geheim|wachtwoord|kennwort|"
                          r"contrase|chiave|sleutel|schl")


def _labelled(text: str, cutoff: _Cutoff) -> list[SecretMatch]:
    """Values announced by a label of a known kind, and by any secret-like key (``GENERIC``)."""
    found: list[SecretMatch] = []
    for entry, pattern in _LABELLED:
        for m in cutoff.take(pattern.finditer(text)):
            value = m.group(1)
            digits, bounds = len(re.sub(r"\D", "", value)), entry.label_digits
            if bounds is not None and not bounds[0] <= digits <= bounds[1]:
                continue
            if entry.label_verify is not None:
                verified = entry.label_verify(text[m.start():m.start(1)], value)
            else:
                verified = entry.verify(value) if entry.verify is not None else True
            found.append(SecretMatch(entry.name, m.start(), m.end(), m.group(0), m.start(1), m.end(1),
                                     verified))
    for m in cutoff.take(_KEY_VALUE.finditer(text)):
        key, value = m.group(1), m.group(2)
        if not _KEY_WORDS.search(key):
            continue
        if len(re.findall(r"\d", value)) < 4 and not _PASSWORDISH.search(key):
            continue  # "name: Anna", "Tel Aviv: 30": 4 digits, unless the key is password-like
        found.append(SecretMatch(GENERIC, m.start(), m.end(), m.group(0), m.start(2), m.end(2)))
    return found


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """The user's ``--secret-pattern`` regexes, compiled under the bound of sources/user_patterns.py;
    a bad one (any compile error, or too slow to compile) raises ``ValueError`` naming it."""
    from gnq_core.sources.user_patterns import compile_user_patterns

    return compile_user_patterns(list(patterns))


def _value_group(pattern: re.Pattern[str]) -> int | str:
    """A user pattern's value: its group named ``value``, else its first group other than
    ``free``, else the whole match."""
    if "value" in pattern.groupindex:
        return "value"
    free = pattern.groupindex.get("free")
    return next((g for g in range(1, pattern.groups + 1) if g != free), 0)


def _free_span(m: re.Match[str], value: int | str) -> tuple[int, int]:
    """The span of the match's ``free`` group inside its value, (-1, -1) when not named or empty."""
    if "free" not in m.re.groupindex or m.start("free") < 0:
        return -1, -1
    a, b = max(m.start("free"), m.start(value)), min(m.end("free"), m.end(value))
    return (a, b) if b > a else (-1, -1)


# At most this many values of a text are kept (the secret attack probes its first 64): a declared
# secret of one character, or a pattern matching every word, found a match per character of a
# 1.5 MB text (1.5 million, +2.2 GB).
MAX_VALUES_PER_TEXT = 1024


class _Cutoff:
    """Where the matches of a text stop being complete: each source of matches (a pattern, a
    declared value) stops after ``MAX_VALUES_PER_TEXT`` of them, and every match ending by the end
    of the last one it gave is found, as without the bound (later matches start after it)."""

    def __init__(self) -> None:
        self.at = math.inf

    def take(self, matches: Iterable[Any]) -> Iterator[Any]:
        """``matches`` (regex matches, or (start, end) pairs), at most ``MAX_VALUES_PER_TEXT``."""
        for n, m in enumerate(matches, 1):
            yield m
            if n == MAX_VALUES_PER_TEXT:
                self.at = min(self.at, m[1] if isinstance(m, tuple) else m.end())
                return


def _occurrences(text: str, value: str) -> Iterator[tuple[int, int]]:
    start = text.find(value)
    while start >= 0:
        yield start, start + len(value)
        start = text.find(value, start + len(value))


def find_secrets(text: str, extra_patterns: Sequence[re.Pattern[str]] = (),
                 declared: Iterable[str] = ()) -> list[SecretMatch]:
    """Every secret-like match in ``text``, in order, without overlaps (the module docstring says
    what ``extra_patterns`` and ``declared`` add); at most ``MAX_VALUES_PER_TEXT``, the first."""
    text = str(text)
    cutoff = _Cutoff()
    found: list[SecretMatch] = []
    for value in sorted({str(v).strip() for v in declared if v is not None and str(v).strip()}):
        spans = cutoff.take(_occurrences(text, value))
        found += [SecretMatch("declared", a, b, value, a, b) for a, b in spans]
    for pattern in extra_patterns:
        g = _value_group(pattern)
        for m in cutoff.take(pattern.finditer(text)):
            if m.end(g) > m.start(g):
                free = _free_span(m, g)
                found.append(SecretMatch("custom", m.start(), m.end(), m.group(0), m.start(g), m.end(g),
                                         free_start=free[0], free_end=free[1]))
    for entry in KINDS:  # the catalog's detectors, kind by kind
        for detector in entry.detectors:
            for a, b, va, vb in cutoff.take(detector.spans(text)):
                if detector.valid is None or detector.valid(text[va:vb]):
                    found.append(SecretMatch(entry.name, a, b, text[a:b], va, vb))
    labelled = _labelled(text, cutoff)
    kept = _without_overlaps(found + [s for s in labelled if s.kind != GENERIC])
    # a value after any secret-like key counts where no match of a known kind covers it
    generic = [s for s in labelled if s.kind == GENERIC and not _covered(s, kept)]
    result = _without_overlaps(kept + generic) if generic else kept
    if cutoff.at < math.inf:
        result = [s for s in result if s.end <= cutoff.at]
    return result[:MAX_VALUES_PER_TEXT]


def _covered(s: SecretMatch, kept: list[SecretMatch]) -> bool:
    """Whether a value of ``kept`` (in order, not overlapping) overlaps ``s``'s value: only the
    last one starting before ``s``'s value ends can (their ends increase too)."""
    i = bisect.bisect_left(kept, s.value_end, key=lambda k: k.value_start) - 1
    return i >= 0 and kept[i].value_end > s.value_start


def _without_overlaps(found: list[SecretMatch]) -> list[SecretMatch]:
    """Earlier first; at one start the longer; at equal spans the one listed first (the sort is
    stable: declared, custom, the patterns, then the labels)."""
    kept: list[SecretMatch] = []
    for s in sorted(found, key=lambda s: (s.start, -(s.end - s.start))):
        if not kept or s.start >= kept[-1].end:
            kept.append(s)
    return kept


def values_json(found: Sequence[SecretMatch]) -> str:
    """Every match of a text as the store keeps it (``secret_values``)."""
    return json.dumps([{"kind": s.kind, "start": s.start, "end": s.end, "value_start": s.value_start,
                        "value_end": s.value_end, "verified": s.verified,
                        **({"free_start": s.free_start, "free_end": s.free_end} if s.free_start >= 0 else {})}
                       for s in found])


def values_from_json(text: str, stored: object) -> list[SecretMatch]:
    """The matches ``values_json`` stored for ``text`` ([] for None / NA: nothing stored)."""
    if not isinstance(stored, str) or not stored:
        return []
    text = str(text)
    return [SecretMatch(v["kind"], v["start"], v["end"], text[v["start"]:v["end"]], v["value_start"],
                        v["value_end"], bool(v.get("verified", True)), int(v.get("free_start", -1)),
                        int(v.get("free_end", -1))) for v in json.loads(stored)]


def secret_labels(texts: Sequence[str], extra_patterns: Sequence[re.Pattern[str]] = (),
                  declared: Sequence[Iterable[str]] | None = None,
                  public: Sequence[bool] | None = None) -> pd.DataFrame:
    """Per text (input order): ``secret`` (the kinds found, comma-separated, in text order; None
    when nothing matched), ``secret_start`` / ``secret_end`` (character span of the first
    match), ``secret_match`` (its string) and ``secret_values`` (every match, ``values_json``).
    ``declared``: per text, its known private values; ``public``: texts marked public are not
    searched (a public text holds nothing private)."""
    rows = []
    for i, text in enumerate(texts):
        found = [] if public is not None and public[i] else find_secrets(
            text, extra_patterns, declared[i] if declared is not None else ())
        if not found:
            rows.append((None, None, None, None, None))
            continue
        kinds = list(dict.fromkeys(s.kind for s in found))
        rows.append((", ".join(kinds), found[0].start, found[0].end, found[0].text, values_json(found)))
    frame = pd.DataFrame(rows, columns=SECRET_COLUMNS)
    return frame.astype({"secret_start": "Int64", "secret_end": "Int64"})
