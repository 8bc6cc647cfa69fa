"""One entry per secret kind: how it is found, how it is checked, what of it is format and what
is secret, how its exposure is measured, and the words a page uses for it.

Every module that needs a fact about a kind reads it here: the detectors (sources/secrets.py),
the check digits and the alphabet of its free characters (attacks/exposure.py), the nouns and
the action when it leaks (analysis/verdict.py, analysis/findings.py).  Adding a kind is one
``SecretKind`` in ``KINDS`` plus its tests; a kind the catalog does not know (a store written by
another version) reads as ``UNKNOWN``'s words.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from gnq_core.catalog.addresses import addresses
from gnq_core.catalog.checksums import iban_check_digits, iban_ok, luhn_digit, luhn_ok
from gnq_core.catalog.detectors import Detector, regex, scan
from gnq_core.catalog.keys import generic_keys
from gnq_core.catalog.national_ids import (
    LABEL_WORDS,
    id_check_fill,
    id_check_ok,
    id_check_places,
    id_ok,
    labelled_id_ok,
    national_ids,
)
from gnq_core.catalog.people import dates_of_birth, names
from gnq_core.catalog.phones import plan_valid
from gnq_core.catalog.scans import emails, jwts

DIGITS = "0123456789"
BASE62 = string.ascii_letters + DIGITS
# How a kind's exposure is measured (attacks/exposure.py):
SPACE = "space"        # a rank among every value its format allows (uniform: exact or estimated)
RELATIVE = "relative"  # values are not uniform (names, e-mails, addresses): no candidate space
RELATIVE_TEMPLATE = "(relative to the reference model)"  # such values' format (attacks/exposure_relative.py)
NONE = None            # no exposure (a password's or phrase's space is not the format's)


@dataclass(frozen=True)
class Check:
    """Characters a format derives from the others (a card's Luhn digit, an IBAN's two check
    digits): an exposure's candidate space recomputes them instead of counting them as free."""

    places: Callable[[str], tuple[int, ...]]  # their indices in the value ((): the value fails its check)
    fill: Callable[[str], str]                # the value with them recomputed from the rest
    valid: Callable[[str], bool]              # the value satisfies the check


def _alnum(value: str) -> list[int]:
    return [i for i, c in enumerate(value) if c.isalnum()]


def _luhn_places(value: str) -> tuple[int, ...]:
    digits = [i for i, c in enumerate(value) if c.isdigit()]
    return (digits[-1],) if digits and luhn_ok("".join(value[i] for i in digits)) else ()


def _luhn_fill(value: str) -> str:
    digits = [i for i, c in enumerate(value) if c.isdigit()]
    chars = list(value)
    chars[digits[-1]] = luhn_digit("".join(value[i] for i in digits[:-1]))
    return "".join(chars)


def _iban_places(value: str) -> tuple[int, ...]:
    return tuple(_alnum(value)[2:4]) if iban_ok(value) else ()


def _iban_fill(value: str) -> str:
    places = _alnum(value)
    chars = list(value)
    check = iban_check_digits("".join(value[i] for i in places).upper())
    chars[places[2]], chars[places[3]] = check
    return "".join(chars)


LUHN = Check(_luhn_places, _luhn_fill, lambda v: luhn_ok("".join(c for c in v if c.isdigit())))
IBAN = Check(_iban_places, _iban_fill, iban_ok)
NATIONAL_ID = Check(id_check_places, id_check_fill, id_check_ok)  # the digit-only schemes' (national_ids.py)


@dataclass(frozen=True)
class SecretKind:
    """One kind of secret (module docstring).  ``alphabet``: what a free character may be (None:
    a character of its own class, a digit for a digit, an upper-case letter for one); ``digits_only``:
    only a value made of digits and separators has a candidate space; ``fixed_prefix``: how many of
    the value's leading letters and digits its format fixes (a vendor's key prefix, an IBAN's
    country code)."""

    name: str
    described: str          # "a card-number-like string": the reason's "contains ..."
    one: str                # "card number": a count's noun
    many: str               # "card numbers"
    remedy: str             # what to do with the value in the world once the model can write it
    detectors: tuple[Detector, ...] = ()
    verify: Callable[[str], bool] | None = None  # a labelled value's checksum (verified=False when it fails)
    # where the label says which check applies (a national id's "BSN" or "SIN"): (label, value) -> valid;
    # used instead of ``verify`` on a labelled value
    label_verify: Callable[[str, str], bool] | None = None
    label_words: str | None = None  # the words that announce a labelled value, several languages
    label_value: str | None = None  # the labelled value's shape (one group)
    label_digits: tuple[int, int] | None = None  # how many digits a labelled value holds
    loose_label: bool = False       # the label needs no colon ("phone 555-0148")
    exposure: str | None = SPACE
    alphabet: str | None = DIGITS
    digits_only: bool = True
    check: Check | None = None
    fixed_prefix: Callable[[str], int] = field(default=lambda value: 0)

    def alphabet_of(self, c: str) -> str:
        """The characters a free character ``c`` of a value of this kind may be: the kind's
        alphabet where it holds ``c``, else those of its own class (a digit for a digit, a capital
        for a capital: a letter of an account number's prefix is no digit)."""
        if self.alphabet is not None and c in self.alphabet:
            return self.alphabet
        return DIGITS if c.isdigit() else string.ascii_uppercase if c.isupper() else string.ascii_lowercase

    def format_places(self, value: str) -> set[int]:
        """Indices among ``value``'s letters and digits that the kind's own format fixes or derives:
        its prefix (a vendor's, a country code) and its check characters."""
        alnum = [i for i, c in enumerate(value) if c.isalnum()]
        check = set(self.check.places(value)) if self.check is not None else set()
        return set(range(min(self.fixed_prefix(value), len(alnum)))) | {j for j, i in enumerate(alnum)
                                                                         if i in check}

    @property
    def the(self) -> str:
        """``described`` with "the": "the card-number-like string"."""
        return re.sub(r"^an? ", "the ", self.described, count=1)


_ANNOUNCED_VALUE = r"(?:\s+(?:is|was|are|=)|\s*[:=])?\s*"
_DIGITS_VALUE = r"(\+?\(?\d[\d()]*(?:[ ./-]\(?\d[\d()]*)*)"
_TOKEN_VALUE = r"([^\s,;]*[^\s,;.])"
_EMAIL_VALUE = r"([A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,})"
_IBAN_VALUE = r"([A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){2,8})"


def _card_ok(found: str) -> bool:
    digits = re.sub(r"\D", "", found)
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


def _phone_shape(found: str) -> bool:
    """9-15 digits (E.164) and an international prefix, brackets or at least 3 groups: "1999-2003"
    or "3.14 15" are not phone numbers, nor is an IPv4 address."""
    digits = re.sub(r"\D", "", found)
    if re.fullmatch(r"\d{1,3}(?:\.\d{1,3}){3}", found):
        return False
    groups = len(re.findall(r"\d+", found))
    return 9 <= len(digits) <= 15 and (found.startswith("+") or "(" in found or groups >= 3)


_VENDOR_PREFIX = re.compile(r"(?:AKIA|ASIA|AIza|gh[pousr]_|xox[abprs]-|[rs]k_(?:live|test)_|"
                            r"sk-(?:proj-|ant-)?|eyJ)")


def _vendor_prefix(value: str) -> int:
    """The letters and digits of a key's vendor prefix ("sk_live_" → 6, "AKIA" → 4): the part
    every key of that vendor shares."""
    m = _VENDOR_PREFIX.match(value)
    return sum(c.isalnum() for c in m.group(0)) if m else 0


KINDS: tuple[SecretKind, ...] = (
    SecretKind("private key", "a private key", "private key", "private keys",
               "revoke the key pair and issue a new one",
               (regex(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),), exposure=NONE),
    SecretKind("api key", "a key or token", "key or token", "keys or tokens", "revoke and rotate the key",
               (regex(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),                  # AWS access key id
                regex(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),                 # GitHub token
                regex(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),               # Slack token
                regex(r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}\b"),       # Stripe key
                regex(r"\bAIza[0-9A-Za-z_\-]{35}\b"),                     # Google API key
                regex(r"(?i)\b(?:api[ _-]?key|access[ _-]?token|secret[ _-]?key|auth[ _-]?token|token)"
                      + _ANNOUNCED_VALUE + r"([A-Za-z0-9_\-]{16,})"),
                scan(jwts),                                               # JSON Web Token
                scan(generic_keys)),                  # any vendor: a prefix or keyword + a random run
               alphabet=BASE62, digits_only=False, fixed_prefix=_vendor_prefix),
    SecretKind("card number", "a card-number-like string", "card number", "card numbers",
               "block the card and have a new one issued",
               (regex(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])", _card_ok),), verify=LUHN.valid,
               label_words=r"(?:credit |debit |payment )?card(?: ?(?:number|no\.?|#|nr\.?))?|tarjeta|"
                           r"num[ée]ro de (?:carte|tarjeta)|carte(?: bancaire)?|kartennummer|kreditkarte",
               label_value=_DIGITS_VALUE, label_digits=(12, 19), check=LUHN),
    SecretKind("iban", "an IBAN", "IBAN", "IBANs", "tell the account holder and watch the account for fraud",
               (regex(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b", iban_ok),),
               verify=iban_ok, label_words=r"iban", label_value=_IBAN_VALUE, alphabet=None, digits_only=False,
               check=IBAN, fixed_prefix=lambda value: 2),  # the country code
    SecretKind("recovery phrase", "a recovery phrase", "recovery phrase", "recovery phrases",
               "move the funds to a wallet with a new phrase",
               (regex(r"(?i)\b(?:recovery|seed|mnemonic) phrase\b[^.:\n]{0,40}?(?:\bis\b|:)"
                      r"\s*([a-z]+(?: [a-z]+){5,23})"),), exposure=NONE),
    # "the password for the vault is X": the words between the keyword and "is" are not the password
    SecretKind("password", "a password", "password", "passwords", "change the password everywhere it is used",
               (regex(r"(?i)\b(?:password|passwd|passphrase|passcode|security answer|secret answer)\b"
                      r"(?:\s+(?:for|of|to)\s[^.:\n]{0,40}?(?=\s(?:is|was)\s|\s*[:=]))?"
                      + _ANNOUNCED_VALUE + r"(?!(?:for|of|to|is|was|the|and)\b)([^\s,;]*[^\s,;.])"),),
               label_words=r"password|passwd|pwd|passphrase|passcode|passwort|kennwort|contrase[ñn]a|"
                           r"mot de passe|senha|wachtwoord",
               label_value=_TOKEN_VALUE, exposure=NONE),
    SecretKind("account number", "an account or record number", "account or record number",
               "account or record numbers", "tell the account holder",
               (regex(r"(?i)\b(?:account|customer|member|policy|patient|client) "
                      r"(?:number|no\.?|id|record)\s*[:#]?\s*(\d{5,})\b"),),
               label_words=r"(?:bank |checking |savings |customer |member |client |patient |policy )?"
                           r"account(?: ?(?:number|no\.?|#|id|nr\.?))?|acct\.?(?: no\.?)?|kontonummer|"
                           r"n[úu]mero de cuenta|num[ée]ro de compte",
               label_value=r"([A-Z]{0,3}\d[\d -]{2,}\d)", label_digits=(4, 99)),
    SecretKind("pin", "a PIN", "PIN", "PINs", "change the PIN",
               (regex(r"(?i)\b(?:pin(?: code| number)?|(?:door|alarm|access|security|entry|gate) code)"
                      r"(?:[^.\n]{0,60}?(?:\s(?:is|was)\b|[:=]))?\s*(\d{4,8}(?:-\d{1,4})?)\b"),),
               label_words=r"pin(?: ?(?:code|number|no\.?))?|code pin|geheimzahl", label_value=r"(\d{3,8})"),
    # before "id number": a "national ID number" whose check digits hold is this kind, else that one
    SecretKind("national id", "a national identity or tax number", "national identity or tax number",
               "national identity or tax numbers", "tell the holder and report the number as exposed",
               (scan(national_ids),), verify=id_ok, label_verify=labelled_id_ok, label_words=LABEL_WORDS,
               label_value=r"((?:[A-Z]{1,6}[ -]?)?\d(?:[ .\-]?[\dA-Z]){5,16})(?![\w\-])",
               label_digits=(6, 16), check=NATIONAL_ID),
    SecretKind("id number", "an identity-document number", "identity-document number",
               "identity-document numbers", "tell the holder and report the document number as exposed",
               (regex(r"(?i)\b(?:passport|document|licen[cs]e|national id|tax id) (?:number|no\.?|id)"
                      r"\s*[:#]?\s*([A-Z]{0,3}\d{6,})\b"),), alphabet=None, digits_only=False),
    SecretKind("ssn", "a social-security-like number", "social-security number", "social-security numbers",
               "tell the person and place a fraud alert", (regex(r"\b\d{3}-\d{2}-\d{4}\b"),),
               label_words=r"ssn|social security(?: ?(?:number|no\.?))?|sozialversicherungsnummer|"
                           r"n[úu]mero de seguridad social",
               label_value=_DIGITS_VALUE, label_digits=(4, 99)),
    SecretKind("phone", "a phone number", "phone number", "phone numbers", "remove the person's number",
               (regex(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,8}(?:[ .-]\d{2,8}){1,4}"
                      r"(?![\w-])", lambda found: _phone_shape(found) and plan_valid(found)),),
               verify=plan_valid,
               label_words=r"(?:tele)?phone(?: ?(?:number|no\.?))?|tel\.?|mobile|cell|fax|whatsapp|"
                           r"tel[ée]fono|t[ée]l[ée]phone|telefon(?:nummer)?|handy|m[óo]vil|portable|celular",
               label_value=_DIGITS_VALUE, label_digits=(6, 15), loose_label=True),
    SecretKind("email", "an e-mail address", "e-mail address", "e-mail addresses",
               "remove the person's address", (scan(emails),),
               label_words=r"e-?mail(?: address)?|correo(?: electr[óo]nico)?|courriel",
               label_value=_EMAIL_VALUE,
               exposure=RELATIVE, alphabet=None, digits_only=False),
    SecretKind("address", "a street address", "street address", "street addresses",
               "remove the person's record (the address and the name it belongs to)", (scan(addresses),),
               exposure=RELATIVE, alphabet=None, digits_only=False),
    SecretKind("name", "a person's name", "person's name", "persons' names", "remove the person's record",
               (scan(names),), exposure=RELATIVE, alphabet=None, digits_only=False),
    SecretKind("date of birth", "a date of birth", "date of birth", "dates of birth",
               "remove the date of birth from the person's record", (scan(dates_of_birth),),
               exposure=RELATIVE, alphabet=None, digits_only=False),
    # the kinds a user's own inputs give and the generic "key: value" (sources/secrets.py finds them)
    SecretKind("labelled value", "a labelled private value", "labelled value", "labelled values",
               "change or remove the value"),
    SecretKind("custom", "a value matching --secret-pattern", "custom value", "custom values",
               "change or remove the value"),
    SecretKind("declared", "a value of --secret-column", "declared value", "declared values",
               "change or remove the value"),
)
KIND_BY_NAME: dict[str, SecretKind] = {k.name: k for k in KINDS}
UNKNOWN = SecretKind("secret", "a secret-like value", "secret-like value", "secret-like values",
                     "change or remove the value")


def kind(name: object) -> SecretKind:
    """The catalog's entry for a stored kind, ``UNKNOWN`` for one it does not know."""
    return KIND_BY_NAME.get(str(name).strip(), UNKNOWN)


def count_words(name: str, n: int) -> str:
    """"2 PINs", "1 key or token"."""
    entry = KIND_BY_NAME.get(name)
    if entry is None:
        return f"{n} {name}"
    return f"{n} {entry.one if n == 1 else entry.many}"
