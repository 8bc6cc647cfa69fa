"""Street addresses, offline: a house number, a street name ending in a street suffix, then a
city with a postcode or ZIP code, in the orders that English-speaking and continental European
countries write them:

* "742 Evergreen Terrace, Springfield, OR 97403", "221B Baker Street, London NW1 6XE",
  "1600 Pennsylvania Ave NW, Washington, DC 20500" (number, street, city, state + ZIP / postcode);
* "Unit 4, 17 Smith Street, Parramatta NSW 2150", "5/23 King Rd, Fitzroy VIC 3065" (Australia:
  an optional unit, "Unit 4," or "5/" before the number, then suburb, state and 4-digit postcode);
* "Hauptstraße 5, 10115 Berlin", "12 rue de la Paix, 75002 Paris", "Calle Mayor 10, 28013 Madrid"
  (street and number, postcode, city).

A house number and a street alone ("10 Downing Street", a news story's) are not enough: the
postcode or ZIP that makes an address a person's is required, or a label ("address:",
"lives at") before it."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gnq_core.catalog.detectors import Span

_SUFFIX = (r"(?:Street|St|Road|Rd|Avenue|Ave|Lane|Ln|Drive|Dr|Boulevard|Blvd|Court|Ct|Way|Place|Pl|"
           r"Terrace|Close|Crescent|Cres|Square|Sq|Parkway|Pkwy|Highway|Hwy|Circle|Cir|Row|Mews|Grove|"
           r"Gardens|Hill|Walk|Trail|Alley|Path|Parade|Pde|Tce|Circuit|Cct|Esplanade|Esp)\.?")
_WORD = r"[A-Z][a-z]+\.?"
_US_STATE_ZIP = r"[A-Z]{2},?\s+\d{5}(?:-\d{4})?"
_UK_POSTCODE = r"[A-Z]{1,2}\d[A-Z\d]?\s*\d[A-Z]{2}"
_CITY = r"[A-Z][a-z]+(?:[ -][A-Z][a-z]+){0,2}"
_DIRECTION = r"(?:\s+(?:N|S|E|W|NE|NW|SE|SW))?"
# English order: number, street + suffix, optional unit, city, then state + ZIP or a UK postcode
_ENGLISH = re.compile(
    r"\b\d{1,5}[A-Z]?\s+(?:" + _WORD + r"\s+){1,3}" + _SUFFIX + _DIRECTION
    + r"(?:,?\s+(?:Apt|Apartment|Suite|Unit|Flat)\.?\s*#?\w{1,5})?"
    + r",\s*" + _CITY + r",?\s+(?:" + _US_STATE_ZIP + r"|" + _UK_POSTCODE + r")\b")
# Australian: an optional unit ("Unit 4, ", "Flat 2/", "5/"), number, street + suffix, suburb, one of
# the eight states and territories, 4-digit postcode
_AU_STATE = r"(?:NSW|VIC|QLD|WA|SA|TAS|ACT|NT)"
_AUSTRALIAN = re.compile(
    r"(?:\b(?:Unit|Flat|Apt|Apartment|Suite|Shop|Level)\.?\s*\d{1,4}[A-Z]?(?:,\s*|\s*/\s*|\s+)"
    r"|\b\d{1,4}[A-Z]?/)?\b\d{1,5}[A-Z]?\s+(?:" + _WORD + r"\s+){1,3}" + _SUFFIX
    + r",?\s+" + _CITY + r",?\s+" + _AU_STATE + r",?\s+\d{4}\b")
# continental order: street (a compound "...straße" or "rue/calle/via/avenida ... "), number, postcode, city
_STREET_DE = r"[A-ZÄÖÜ][a-zäöüß]+(?:straße|strasse|str\.|weg|gasse|platz|allee|ring|damm|ufer)"
_STREET_ROMANCE = (r"(?:rue|avenue|boulevard|place|chemin|calle|avenida|plaza|paseo|via|viale|piazza|"
                   r"rua|straat|laan|gracht)(?:\s+[a-zA-Zà-ÿ'’]+){1,4}")
_CONTINENTAL = re.compile(
    r"(?:\b\d{1,4}[a-z]?,?\s+" + _STREET_ROMANCE + r"|\b(?:" + _STREET_DE + r"|" + _STREET_ROMANCE
    + r")\s+\d{1,4}[a-z]?)" + r",\s*(?:[A-Z]-)?\d{4,5}\s+[A-ZÀ-Ý][a-zà-ÿ]+(?:[ -][A-ZÀ-Ý][a-zà-ÿ]+)?\b",
    re.IGNORECASE)
# "address: 5 Elm Row, Leeds" or "lives at 5 Elm Row, Leeds": a label makes the number and street enough
_LABELLED = re.compile(
    r"(?i:\b(?:(?:home |street |postal |mailing |billing |shipping )?address|lives at|living at|resides at|"
    r"adresse|anschrift|direcci[óo]n|domicilio))\s*(?::|\bis\b)?\s*"
    r"(\d{1,5}[A-Z]?\s+(?:" + _WORD + r"\s+){1,3}" + _SUFFIX + r"(?:,\s*" + _CITY + r")?)")


def addresses(text: str) -> Iterator[Span]:
    """(start, end, value_start, value_end) of every address the module docstring describes."""
    for m in _ENGLISH.finditer(text):
        yield m.start(), m.end(), m.start(), m.end()
    for m in _AUSTRALIAN.finditer(text):
        yield m.start(), m.end(), m.start(), m.end()
    for m in _CONTINENTAL.finditer(text):
        yield m.start(), m.end(), m.start(), m.end()
    for m in _LABELLED.finditer(text):
        yield m.start(), m.end(), m.start(1), m.end(1)
