"""Secret- and PII-like content in a text: card numbers, PINs, passwords and recovery phrases,
keys and tokens, IBANs, account, passport and social-security numbers, phone numbers, e-mail
addresses.

Offline patterns, no model: each kind is a regular expression plus, where the format has one,
its checksum (Luhn for card numbers, ISO 7064 mod 97 for IBANs), so a random 16-digit number
is not called a card.  The key and token shapes are the published formats of their issuers
(AWS access keys, GitHub, Slack and Stripe tokens, Google API keys, JSON Web Tokens, PEM
private keys) as used by detect-secrets and gitleaks; a password, PIN or recovery phrase is
recognised by the words that announce it ("PIN 4821", "password: ...", "customer number ...").  What a pattern
cannot know (a name, an address) is not claimed: the label means "looks like a secret".

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


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    total, double = 0, False
    for ch in reversed(digits):
        d = int(ch) * (2 if double else 1)
        total += d - 9 if d > 9 else d
        double = not double
    return total % 10 == 0


def iban_ok(iban: str) -> bool:
    """ISO 13616 check digits (mod 97 == 1)."""
    s = iban.replace(" ", "").upper()
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


_ANNOUNCED_VALUE = r"(?:\s+(?:is|was|are|=)|\s*[:=])?\s*"
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("private key", re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")),
    ("api key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),                       # AWS access key id
    ("api key", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b")),                      # GitHub token
    ("api key", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),                    # Slack token
    ("api key", re.compile(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}\b")),            # Stripe key
    ("api key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),                          # Google API key
    ("api key", re.compile(r"(?i)\b(?:api[ _-]?key|access[ _-]?token|secret[ _-]?key|auth[ _-]?token|token)"
                           + _ANNOUNCED_VALUE + r"([A-Za-z0-9_\-]{16,})")),
    ("card number", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")),
    ("iban", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")),
    ("recovery phrase", re.compile(r"(?i)\b(?:recovery|seed|mnemonic) phrase\b[^.:\n]{0,40}?(?:\bis\b|:)"
                                   r"\s*([a-z]+(?: [a-z]+){5,23})")),
    # "the password for the vault is X": the words between the keyword and "is" are not the password
    ("password", re.compile(r"(?i)\b(?:password|passwd|passphrase|passcode|security answer|secret answer)\b"
                            r"(?:\s+(?:for|of|to)\s[^.:\n]{0,40}?(?=\s(?:is|was)\s|\s*[:=]))?"
                            + _ANNOUNCED_VALUE + r"(?!(?:for|of|to|is|was|the|and)\b)([^\s,;]*[^\s,;.])")),
    ("account number", re.compile(r"(?i)\b(?:account|customer|member|policy|patient|client) "
                                  r"(?:number|no\.?|id|record)\s*[:#]?\s*(\d{5,})\b")),
    ("pin", re.compile(r"(?i)\b(?:pin(?: code| number)?|(?:door|alarm|access|security|entry|gate) code)"
                       r"(?:[^.\n]{0,60}?(?:\s(?:is|was)\b|[:=]))?\s*(\d{4,8}(?:-\d{1,4})?)\b")),
    ("id number", re.compile(r"(?i)\b(?:passport|document|licen[cs]e|national id|tax id) (?:number|no\.?|id)"
                             r"\s*[:#]?\s*([A-Z]{0,3}\d{6,})\b")),
    ("ssn", re.compile(r"\b\d{3}-\d{2}-\d{4}\b")),
    ("phone", re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,8}(?:[ .-]\d{2,8}){1,4}"
                         r"(?![\w-])")),
]


# Two shapes are found by the scans below rather than by a regex: as regexes (a JSON Web Token
# ``\beyJ[T]{8,}\.eyJ[T]{8,}\.[T]{8,}``, an e-mail address ``\b[L]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b``)
# Python's engine retries every word boundary of a long run of T or L characters and rescans the
# run from each: quadratic ("ab-ab-ab-…", 600 KB, took minutes).  The scans find the same matches
# in one pass: within one run every start reaches the same run end, so only the first can match.
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_\-]*")
_JWT_HEAD = re.compile(r"\beyJ")
_JWT_TAIL = re.compile(r"\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")
_EMAIL_LOCAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
_EMAIL_DOMAIN = re.compile(r"@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")
_WORD = re.compile(r"\w")


def _jwts(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each JSON Web Token, as the regex above finds them, in one pass."""
    resume, run_end, tail = 0, -1, None
    for head in _JWT_HEAD.finditer(text):
        start = head.start()
        if start < resume:
            continue
        if start >= run_end:  # a new run of token characters: its end and what follows it, once
            run_end = _TOKEN_RUN.match(text, start + 3).end()
            tail = _JWT_TAIL.match(text, run_end)
        if tail is not None and run_end - start - 3 >= 8:
            yield start, tail.end()
            resume = tail.end()


def _boundary(text: str, i: int) -> bool:
    """Whether ``\\b`` matches at ``i`` (Python's Unicode word characters)."""
    before = i > 0 and _WORD.match(text, i - 1) is not None
    return before != (i < len(text) and _WORD.match(text, i) is not None)


def _emails(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each e-mail address, as the regex above finds them, in one pass: per "@"
    with a domain after it, the run of local-part characters before it, from its first word
    boundary not inside the previous address."""
    resume = 0
    for domain in _EMAIL_DOMAIN.finditer(text):
        at = domain.start()
        run = at
        while run > resume and text[run - 1] in _EMAIL_LOCAL:  # runs before two "@" never overlap
            run -= 1
        start = next((i for i in range(run, at) if _boundary(text, i)), None)
        if start is not None:
            yield start, domain.end()
            resume = domain.end()


_SCANNED = (("api key", _jwts), ("email", _emails))


def _valid(kind: str, found: str) -> bool:
    digits = re.sub(r"\D", "", found)
    if kind == "card number":
        return 13 <= len(digits) <= 19 and luhn_ok(digits)
    if kind == "iban":
        return iban_ok(found)
    if kind == "phone":
        # 9-15 digits (E.164) and either an international prefix, brackets or at least 3 groups:
        # "1999-2003" or "3.14 15" are not phone numbers.
        groups = len(re.findall(r"\d+", found))
        if re.fullmatch(r"\d{1,3}(?:\.\d{1,3}){3}", found):
            return False  # an IPv4 address
        return 9 <= len(digits) <= 15 and (found.startswith("+") or "(" in found or groups >= 3)
    return True


# ------------------------------------------------------------------------------ labelled values
# "label: value": the label names the kind; a colon, "=", "#" or "is" announces the value.
_DIGITS_VALUE = r"(\+?\(?\d[\d()]*(?:[ ./-]\(?\d[\d()]*)*)"
_TOKEN_VALUE = r"([^\s,;]*[^\s,;.])"
_EMAIL_VALUE = r"([A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,})"
_IBAN_VALUE = r"([A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){2,8})"
_LABELS: list[tuple[str, str, str]] = [  # kind, the label's words (several languages), the value's shape
    ("card number", r"(?:credit |debit |payment )?card(?: ?(?:number|no\.?|#|nr\.?))?|tarjeta|"
                    r"num[ée]ro de (?:carte|tarjeta)|carte(?: bancaire)?|kartennummer|kreditkarte",
     _DIGITS_VALUE),
    ("pin", r"pin(?: ?(?:code|number|no\.?))?|code pin|geheimzahl", r"(\d{3,8})"),
    ("phone", r"(?:tele)?phone(?: ?(?:number|no\.?))?|tel\.?|mobile|cell|fax|whatsapp|"
              r"tel[ée]fono|t[ée]l[ée]phone|telefon(?:nummer)?|handy|m[óo]vil|portable|celular",
     _DIGITS_VALUE),
    ("iban", r"iban", _IBAN_VALUE),
    ("password", r"password|passwd|pwd|passphrase|passcode|passwort|kennwort|contrase[ñn]a|mot de passe|"
                 r"senha|wachtwoord", _TOKEN_VALUE),
    ("ssn", r"ssn|social security(?: ?(?:number|no\.?))?|sozialversicherungsnummer|"
            r"n[úu]mero de seguridad social", _DIGITS_VALUE),
    ("email", r"e-?mail(?: address)?|correo(?: electr[óo]nico)?|courriel", _EMAIL_VALUE),
    ("account number", r"(?:bank |checking |savings |customer |member |client |patient |policy )?"
                       r"account(?: ?(?:number|no\.?|#|id|nr\.?))?|acct\.?(?: no\.?)?|kontonummer|"
                       r"n[úu]mero de cuenta|num[ée]ro de compte", r"([A-Z]{0,3}\d[\d -]{2,}\d)"),
]
_LABEL_TAIL = r"\s*(?:[:=#]|\s(?:is|was|ist|es|est)\b)\s*"
# a phone number needs no colon after its label ("phone 555-0148"); a card number does ("card 4111
# 1111 1111 1112" is a random number that fails its checksum, "Card number: ..." is a card)
_LOOSE = {"phone": r"\s*(?:[:=#]|\s(?:is|was)\b|\s(?=[+(\d]))\s*"}
_LABELLED = [(kind, re.compile(r"(?i)(?<![\w@])(?:" + words + r")" + _LOOSE.get(kind, _LABEL_TAIL)
                               + r"(?-i:" + value + ")"))
             for kind, words, value in _LABELS]
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
    for kind, pattern in _LABELLED:
        for m in cutoff.take(pattern.finditer(text)):
            value = m.group(1)
            digits = re.sub(r"\D", "", value)
            if kind in ("card number", "phone", "ssn", "account number") and len(digits) < 4:
                continue
            if (kind == "card number" and not 12 <= len(digits) <= 19) or (
                    kind == "phone" and not 6 <= len(digits) <= 15):
                continue
            verified = (luhn_ok(digits) if kind == "card number" else
                        iban_ok(value) if kind == "iban" else True)
            found.append(SecretMatch(kind, m.start(), m.end(), m.group(0), m.start(1), m.end(1), verified))
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
    for kind, pattern in _PATTERNS:
        for m in cutoff.take(pattern.finditer(text)):
            if _valid(kind, m.group(0)):
                value = 1 if m.re.groups else 0  # the announced value's group, else the whole match
                found.append(SecretMatch(kind, m.start(), m.end(), m.group(0), m.start(value), m.end(value)))
    for kind, scan in _SCANNED:
        found += [SecretMatch(kind, a, b, text[a:b], a, b) for a, b in cutoff.take(scan(text))]
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
