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

``find_secrets(text)`` lists every match (kind, start, end, matched string) in text order,
overlaps resolved in favour of the earlier, then longer match; ``secret_labels(texts)`` gives
the per-text label the store keeps: the kinds found and the first match's span.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

SECRET_COLUMNS = ["secret", "secret_start", "secret_end", "secret_match"]


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
    ("api key", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),  # JWT
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
    ("email", re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")),
    ("phone", re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}"
                         r"(?![\w-])")),
]


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


def find_secrets(text: str) -> list[SecretMatch]:
    """Every secret-like match in ``text``, in order, without overlaps."""
    text = str(text)
    found: list[SecretMatch] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if _valid(kind, m.group(0)):
                value = 1 if m.re.groups else 0  # the announced value's group, else the whole match
                found.append(SecretMatch(kind, m.start(), m.end(), m.group(0), m.start(value), m.end(value)))
    found.sort(key=lambda s: (s.start, -(s.end - s.start)))
    kept: list[SecretMatch] = []
    for s in found:
        if not kept or s.start >= kept[-1].end:
            kept.append(s)
    return kept


def secret_labels(texts: Sequence[str]) -> pd.DataFrame:
    """Per text (input order): ``secret`` (the kinds found, comma-separated, in text order; None
    when nothing matched), ``secret_start`` / ``secret_end`` (character span of the first
    match) and ``secret_match`` (its string)."""
    rows = []
    for text in texts:
        found = find_secrets(text)
        if not found:
            rows.append((None, None, None, None))
            continue
        kinds = list(dict.fromkeys(s.kind for s in found))
        rows.append((", ".join(kinds), found[0].start, found[0].end, found[0].text))
    frame = pd.DataFrame(rows, columns=SECRET_COLUMNS)
    return frame.astype({"secret_start": "Int64", "secret_end": "Int64"})
