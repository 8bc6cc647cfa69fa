"""National identity and tax numbers, found by the word that names them and checked by their own
check digits (python-stdnum's implementations, imported on first use as checksums.py does):

* UK National Insurance number ("NI number", "national insurance", "NINO"): two letters, six
  digits, A-D; it has no check digit, so its check is HMRC's allocation rules (letters never used,
  prefixes never issued), and it needs its label like every other scheme;
* German Steuer-ID ("Steuer-ID", "Steueridentifikationsnummer", "IdNr"): 11 digits, ISO 7064
  mod 11,10 and the repeated-digit rule;
* French NIR ("NIR", "numéro de sécurité sociale", "carte vitale"): 15 characters, mod 97;
* Spanish DNI ("DNI", "NIF"): 8 digits and a check letter;
* Dutch BSN ("BSN", "burgerservicenummer", "sofinummer"): 9 digits, the 11-test;
* Indian Aadhaar ("Aadhaar", "UIDAI"): 12 digits, Verhoeff;
* Canadian SIN ("SIN", "social insurance number", "NAS"): 9 digits, Luhn;
* Australian TFN ("TFN", "tax file number"): 8 or 9 digits, weighted mod 11.

Each of these is a digit run that an ordinary number can have the shape of, so a value counts only
after a word naming its scheme (at most ``GAP`` characters before it, no digit between) and with
its check valid.  Two formats are distinctive and checksummed enough to need no label: the Italian
codice fiscale (16 letters and digits in a fixed pattern, a check letter) and the Spanish NIE (X, Y
or Z, seven digits, a check letter).  A generic label ("national ID number", "tax ID") admits a
value valid in any scheme.

``id_check_*``: the check digits an exposure's candidate space recomputes instead of counting as
free, for the digit-only values whose check completes every body with exactly one value (Luhn for
9 digits, mod 11,10 for 11, Verhoeff for 12, mod 97 for 15).  The 11-tests of the BSN and TFN leave
some bodies without any valid check digit, so a candidate space that recomputed them would not
hold the values it counts; their check digit stays free."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gnq_core.catalog.detectors import Span

GAP = 30  # characters between a label and its value ("Steuer-ID des Kunden: ..."), none a digit


def _stdnum(module: str) -> Callable[[str], bool]:
    """stdnum's ``is_valid`` of ``module`` ("de.idnr"), imported on first call."""
    def valid(value: str) -> bool:
        import importlib

        return bool(importlib.import_module(f"stdnum.{module}").is_valid(value))
    return valid


# HMRC: neither letter D, F, I, Q, U or V, the second not O, and the prefixes BG, GB, KN, NK, NT, TN, ZZ
# never issued (a temporary TN number is no person's); then six digits and a suffix A-D
_NINO = re.compile(r"(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]\d{6}[A-D]")


def nino_ok(value: str) -> bool:
    """HMRC's format rules on a National Insurance number (there is no check digit)."""
    return _NINO.fullmatch(re.sub(r"[\s-]", "", value).upper()) is not None


def _digits(n: int, tail: str = r"\d") -> str:
    """``n`` digits in any grouping by single spaces, dots or dashes ("046 454 286", "1112.22.333")."""
    return r"\d(?:[ .\-]?" + tail + r"){" + str(n - 1) + r"}"


@dataclass(frozen=True)
class Scheme:
    name: str
    labels: str                   # the words naming it (a regex; case-insensitive unless scoped)
    value: str                    # the value's shape (a regex, no groups)
    valid: Callable[[str], bool]  # its check on the value found
    distinctive: bool = False     # found without a label too


_NUMBER = r"(?:\s*(?:number|no\.?|nr\.?|num\.?|#))?"
SCHEMES: tuple[Scheme, ...] = (
    Scheme("uk nino", r"national insurance" + _NUMBER + r"|(?-i:NI|NINO)" + _NUMBER,
           r"[A-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D]", nino_ok),
    Scheme("de steuer-id", r"steuer[- ]?id(?:entifikationsnummer)?|steuerliche identifikationsnummer|"
           r"identifikationsnummer|(?-i:IdNr)\.?", _digits(11), _stdnum("de.idnr")),
    Scheme("fr nir", r"(?-i:NIR)|num[ée]ro de s[ée]curit[ée] sociale|n[°º] de s[ée]curit[ée] sociale|"
           r"num[ée]ro d'inscription au r[ée]pertoire|carte vitale|num[ée]ro de s[ée]cu",
           r"[1-478](?:[ .]?\d){4}[ .]?(?:\d\d|2[AB])(?:[ .]?\d){8}", _stdnum("fr.nir")),
    Scheme("es dni", r"(?-i:DNI|NIF)|documento nacional de identidad", r"\d{8}[ -]?[A-Z]", _stdnum("es.dni")),
    Scheme("es nie", r"(?-i:NIE)|n[úu]mero de identidad de extranjero", r"[XYZ][ -]?\d{7}[ -]?[A-Z]",
           _stdnum("es.nie"), distinctive=True),
    Scheme("it codice fiscale", r"codice fiscale|(?-i:C\.F\.|CF)",
           r"[A-Z]{6}[\dLMNP-V]{2}[A-EHLMPR-T][\dLMNP-V]{2}[A-Z][\dLMNP-V]{3}[A-Z]",
           _stdnum("it.codicefiscale"), distinctive=True),
    Scheme("nl bsn", r"(?-i:BSN)|burger ?service ?nummer|sofi-?nummer", _digits(9), _stdnum("nl.bsn")),
    Scheme("in aadhaar", r"aadhaa?r|(?-i:UIDAI|UID)", r"[2-9](?:[ .\-]?\d){11}", _stdnum("in_.aadhaar")),
    Scheme("ca sin", r"(?-i:SIN|NAS)|social insurance" + _NUMBER + r"|num[ée]ro d'assurance sociale",
           _digits(9), _stdnum("ca.sin")),
    Scheme("au tfn", r"(?-i:TFN)|tax file" + _NUMBER, r"\d(?:[ .\-]?\d){7,8}", _stdnum("au.tfn")),
)
# words that name an identity number without naming its country: a value valid in any scheme
GENERIC_LABELS = (r"national (?:id(?:entity|entification)?|identity)" + _NUMBER + r"|personal id" + _NUMBER
                  + r"|tax id(?:entification)?" + _NUMBER)
# every label, for the catalog entry's labelled values (sources/secrets.py)
LABEL_WORDS = "|".join(f"(?:{s.labels})" for s in SCHEMES) + "|" + GENERIC_LABELS

_TAIL = rf"(?!\w)[^\d\n]{{0,{GAP}}}?"  # the label ends a word; no digit before the value
# the value is a whole run: no letter, digit or joined group of digits on either side
_BEFORE, _AFTER = r"(?<![\w.\-])", r"(?![\w\-]|[ .]\d)"
_LABELLED = [(s, re.compile(r"(?i)(?<![\w@])(?:" + s.labels + ")" + _TAIL + _BEFORE + "(?-i:(" + s.value
                            + "))" + _AFTER)) for s in SCHEMES]
# one pass for the distinctive shapes (group k: the k-th distinctive scheme's)
_DISTINCTIVE = [s for s in SCHEMES if s.distinctive]
_BARE = re.compile(_BEFORE + "(?:" + "|".join(f"({s.value})" for s in _DISTINCTIVE) + ")" + _AFTER)
# any label at all: most texts have none, and one pass over them spares the per-scheme patterns
_ANY_LABEL = re.compile(r"(?i)(?<![\w@])(?:" + LABEL_WORDS + r")(?!\w)")
_LABEL_OF = [(s, re.compile(r"(?i)(?<![\w@])(?:" + s.labels + r")(?!\w)")) for s in SCHEMES]
_GENERIC = re.compile(r"(?i)(?<![\w@])(?:" + GENERIC_LABELS + r")(?!\w)")
_GENERIC_LABELLED = re.compile(r"(?i)(?<![\w@])(?:" + GENERIC_LABELS + ")" + _TAIL + _BEFORE + "(?-i:("
                               + "|".join(f"(?:{s.value})" for s in SCHEMES) + "))" + _AFTER)


def national_ids(text: str) -> Iterator[Span]:
    """(start, end, value_start, value_end) of every labelled value valid in its label's scheme,
    and of every distinctive one (module docstring)."""
    if _ANY_LABEL.search(text) is not None:
        for scheme, pattern in _LABELLED:
            for m in pattern.finditer(text):
                if scheme.valid(m.group(1)):
                    yield m.start(), m.end(), m.start(1), m.end(1)
        for m in _GENERIC_LABELLED.finditer(text):
            if id_ok(m.group(1)):
                yield m.start(), m.end(), m.start(1), m.end(1)
    for m in _BARE.finditer(text):
        k = m.lastindex or 0
        if _DISTINCTIVE[k - 1].valid(m.group(k)):
            yield m.start(k), m.end(k), m.start(k), m.end(k)


def id_ok(value: str) -> bool:
    """Whether ``value`` is valid in one of the schemes (its shape and its check)."""
    value = value.strip()
    return any(re.fullmatch(s.value, value) and s.valid(value) for s in SCHEMES)


def labelled_id_ok(label: str, value: str) -> bool:
    """Whether ``value`` is valid in a scheme that ``label`` names (any scheme for a generic label)."""
    named = [s for s, pattern in _LABEL_OF if pattern.search(label)]
    if not named and _GENERIC.search(label):
        named = list(SCHEMES)
    value = value.strip()
    return any(re.fullmatch(s.value, value) and s.valid(value) for s in named)


# ------------------------------------------------------------------ check digits for the candidate space
def _luhn(body: str) -> str:
    from stdnum import luhn

    return luhn.calc_check_digit(body)


def _mod_11_10(body: str) -> str:
    from stdnum.iso7064 import mod_11_10

    return mod_11_10.calc_check_digit(body)


def _verhoeff(body: str) -> str:
    from stdnum import verhoeff

    return verhoeff.calc_check_digit(body)


def _mod_97(body: str) -> str:
    return f"{97 - int(body) % 97:02d}"


# digits in the value -> (how many check digits end it, what computes them from the rest)
_CHECKS: dict[int, tuple[int, Callable[[str], str]]] = {
    9: (1, _luhn), 11: (1, _mod_11_10), 12: (1, _verhoeff), 15: (2, _mod_97)}


def _digit_places(value: str) -> list[int]:
    return [i for i, c in enumerate(value) if c.isdigit()]


def id_check_ok(value: str) -> bool:
    """The check digits of a digit-only value (module docstring) are those its body computes."""
    places = _digit_places(value)
    rule = _CHECKS.get(len(places))
    if rule is None or len(places) != sum(c.isalnum() for c in value):
        return False
    digits = "".join(value[i] for i in places)
    return rule[1](digits[:-rule[0]]) == digits[-rule[0]:]


def id_check_places(value: str) -> tuple[int, ...]:
    """The indices of the check digits in ``value`` (() when its check fails or it has none)."""
    if not id_check_ok(value):
        return ()
    places = _digit_places(value)
    return tuple(places[-_CHECKS[len(places)][0]:])


def id_check_fill(value: str) -> str:
    """``value`` with its check digits recomputed from the other digits."""
    places = _digit_places(value)
    n, compute = _CHECKS[len(places)]
    check = compute("".join(value[i] for i in places[:-n]))
    chars = list(value)
    for i, c in zip(places[-n:], check, strict=True):
        chars[i] = c
    return "".join(chars)
