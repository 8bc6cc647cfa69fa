"""What a secret-like value is replaced with when the training data is cleaned: a kind-tagged
placeholder (``[REDACTED_CARD]``) or a surrogate, a random value of the same kind and format.

A surrogate keeps the value's shape character by character (digits stay digits, letters keep
their case, separators and the issuer prefix of a key stay where they are) and its checksum where
the kind has one: a card number's Luhn check digit, an IBAN's mod-97 check digits, a digit-only
national identity number's check digits (a lettered one's check letter is not kept).  It is drawn
from a seeded generator, again until it is none of the values to avoid (every value found in the
data), so a surrogate is never a real value of the data.

``secret_kinds()`` is the one place the kinds are read from (today sources/secrets.py's patterns);
a catalog of kinds elsewhere changes that function only.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Collection

from gnq_core.catalog import kind as catalog_kind
from gnq_core.errors import GNQError
from gnq_core.sources.secrets import luhn_ok

# The kinds the detector reports (sources/secrets.py): its patterns' kinds, the label-only ones and
# the user's (custom: --secret-pattern, declared: --secret-column).
_KINDS = ("private key", "api key", "card number", "iban", "recovery phrase", "password", "account number",
          "pin", "national id", "id number", "ssn", "phone", "email", "labelled value", "custom", "declared")
# The placeholder's tag per kind ("[REDACTED_CARD]"); a kind not listed gets its name in capitals.
_TAGS = {"card number": "CARD", "account number": "ACCOUNT", "id number": "ID_NUMBER", "api key": "API_KEY",
         "private key": "PRIVATE_KEY", "recovery phrase": "RECOVERY_PHRASE", "labelled value": "VALUE",
         "custom": "CUSTOM", "declared": "DECLARED"}
# Issuer prefixes a key keeps (the published shapes sources/secrets.py matches).
_KEY_PREFIX = re.compile(r"^(?:AKIA|ASIA|gh[pousr]_|xox[abprs]-|[rs]k_(?:live|test)_|AIza|eyJ)")
_ATTEMPTS = 1000


def secret_kinds() -> tuple[str, ...]:
    """Every kind of secret-like value the detector can report, in its order."""
    return _KINDS


def placeholder(kind: str) -> str:
    """The kind-tagged placeholder that replaces a value: "[REDACTED_CARD]", "[REDACTED_PIN]"."""
    tag = _TAGS.get(kind) or re.sub(r"[^A-Z0-9]+", "_", kind.upper()).strip("_") or "VALUE"
    return f"[REDACTED_{tag}]"


class SurrogateError(GNQError, ValueError):
    """No surrogate of a value's format could be drawn that differs from every value to avoid."""


def surrogate(kind: str, value: str, rng: random.Random, avoid: Collection[str] = ()) -> str:
    """A random value of ``value``'s kind and format, checksum-valid where the kind has one, that
    is neither ``value`` nor any of ``avoid``."""
    for _ in range(_ATTEMPTS):
        drawn = _draw(kind, value, rng)
        if drawn != value and drawn not in avoid:
            return drawn
    raise SurrogateError(f"no surrogate for a {kind} of {len(value)} characters differs from the data's "
                         f"values after {_ATTEMPTS} draws (its format leaves too few values); use the "
                         "placeholder instead")


def _draw(kind: str, value: str, rng: random.Random) -> str:
    if kind == "email" and "@" in value:
        local, domain = value.rsplit("@", 1)
        return _reshape(local, rng) + "@" + domain  # the domain is the format, the mailbox the secret
    if kind == "iban":
        return _iban(value, rng)
    if kind == "private key":
        return value  # the match is the "-----BEGIN ... PRIVATE KEY-----" header: no secret in it
    keep = _KEY_PREFIX.match(value) if kind == "api key" else None
    head = keep.group(0) if keep else ""
    drawn = head + _reshape(value[len(head):], rng, first_digit_nonzero=kind in ("ssn", "phone"))
    if kind == "card number":
        return _luhn_fixed(drawn)
    if kind == "national id":  # a digit-only one keeps check digits valid where the value's were
        check = catalog_kind(kind).check
        if check is not None and check.places(value):
            return check.fill(drawn)
    return drawn


def _reshape(text: str, rng: random.Random, first_digit_nonzero: bool = False) -> str:
    """``text`` with every digit, lower-case and upper-case letter redrawn within its class."""
    out = []
    seen_digit = False
    for ch in text:
        if ch.isdigit() and ch.isascii():
            pool = "123456789" if first_digit_nonzero and not seen_digit else string.digits
            out.append(rng.choice(pool))
            seen_digit = True
        elif ch.isascii() and ch.islower():
            out.append(rng.choice(string.ascii_lowercase))
        elif ch.isascii() and ch.isupper():
            out.append(rng.choice(string.ascii_uppercase))
        elif ch.isalpha():  # a letter outside ASCII: an ASCII one of its case keeps the shape
            out.append(rng.choice(string.ascii_uppercase if ch.isupper() else string.ascii_lowercase))
        else:
            out.append(ch)
    return "".join(out)


def _luhn_fixed(drawn: str) -> str:
    """``drawn`` with its last digit set so that its digits pass the Luhn check."""
    places = [i for i, c in enumerate(drawn) if c.isdigit()]
    if not places:
        return drawn
    chars = list(drawn)
    for d in string.digits:
        chars[places[-1]] = d
        if luhn_ok("".join(chars[i] for i in places)):
            break
    return "".join(chars)


def _iban(value: str, rng: random.Random) -> str:
    """The same country code and layout, a new account part, and check digits that make it valid."""
    compact = value.replace(" ", "")
    country, body = compact[:2].upper(), _reshape(compact[4:], rng)
    moved = body + country + "00"
    check = 98 - int("".join(str(int(c, 36)) for c in moved.upper())) % 97
    new = f"{country}{check:02d}{body}"
    # the spaces where the value had them
    out, k = [], 0
    for ch in value:
        if ch == " ":
            out.append(" ")
        else:
            out.append(new[k])
            k += 1
    return "".join(out)
