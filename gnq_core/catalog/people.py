"""Person names and dates of birth, offline, from the context that makes them a person's record
rather than a news story's: a label ("Name:", "patient", "policy holder", "account holder"), a
salutation or a signature, a date of birth.  No name list and no NER model: a capitalised
first and last name is enough once the context says it is a person's (a name list would miss
the names it does not hold, and an NER model would have to be downloaded).

A public figure in a news text ("Mr. Blair said", "Jane Austen (born 1775)") has none of these
contexts and is not found; a biography's "born 16 December 1775" without a record's label or a
name before it is not a date of birth here either."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gnq_core.catalog.detectors import Span

_PART = r"[A-Z][a-zà-ÿ]+(?:[-'’][A-Z]?[a-zà-ÿ]+)?"
_PARTICLE = r"(?:van|von|de|del|della|da|di|du|der|den|le|la|bin|al|ter|dos|das)"
# a first and last name: two to four capitalised parts, a middle initial or a particle allowed
NAME = (r"(?-i:" + _PART + r"(?:[ \t]+[A-Z]\.)?(?:[ \t]+(?:" + _PARTICLE + r"[ \t]+)?" + _PART + r"){1,3})")
_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
          r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
DATE = (r"(?:\d{1,2}[./-]\d{1,2}[./-](?:\d{4}|\d{2})|\d{4}-\d{2}-\d{2}|\d{1,2}(?:st|nd|rd|th)?\s+" + _MONTH
        + r",?\s+\d{4}|" + _MONTH + r"\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4})")

_RECORD = (r"(?:full name|(?:first and )?(?:last |sur|family |given )?name|patient(?: name)?|"
           r"policy ?holder|account ?holder|card ?holder|insured(?: person)?|beneficiary|applicant|"
           r"employee(?: name)?|tenant|passenger(?: name)?|guest(?: name)?|customer(?: name)?|"
           r"client(?: name)?|nombre|nom|vorname|nachname|name des versicherten)")
# "Name: Jane Smith", "policy holder is Tom Weber"; without a colon only after the words that
# always announce a person ("patient Maria Lopez"), lower-case ("Customer Satisfaction Index" is none)
_LABELLED_NAME = re.compile(r"(?i)\b" + _RECORD + r"(?:\s*[:=]|\s+is\b)\s*(" + NAME + r")"
                            r"|\b(?-i:patient|policy ?holder|policyholder|account holder|cardholder|insured)"
                            r"\s+(" + NAME + r")")
# "Dear Mrs Anna Berg,", "Mr. John Smith, born ..."
_TITLED = re.compile(r"\b(?:Dear\s+)?(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Herr|Frau|Sr|Sra|Mme|Mlle)\.?\s+(" + NAME
                     + r")(?=,\s*(?:born|b\.|DOB|date of birth|geb\.|\n)|\s*,\s*$)", re.MULTILINE)
# a signature: a closing formula, then a name alone on its line
_SIGNED = re.compile(r"(?im)^\s*(?:(?:best |kind |warm )?regards|sincerely|"
                     r"yours (?:sincerely|faithfully|truly)|"
                     r"cheers|thanks|thank you|best wishes|mit freundlichen grüßen|cordialement|saludos)"
                     r"\s*,?\s*\n\s*(" + NAME + r")\s*$")
# "Jane Smith, born 14 March 1987", "Jane Smith (DOB 14/03/1987)": a name before a date of birth
# (a biography's "Jane Austen (born 16 December 1775)" is public: "born" counts after a comma only)
_BIRTH = (r"(?:,\s*(?i:born(?: on)?|b\.|geb(?:oren)?\.?(?: am)?)|\s*[,(;]\s*(?i:dob|d\.o\.b\.|date of birth))"
          r"\s*[:\-]?\s*")
_NAME_BORN = re.compile(r"(" + NAME + r")" + _BIRTH + DATE)

_DOB_LABEL = (r"(?:date of birth|birth ?date|d\.?o\.?b\.?|geburtsdatum|geboren am|fecha de nacimiento|"
              r"date de naissance|n[ée]e? le)")
# "DOB: 14/03/1987", "date of birth is 3 May 1990": a label that says it; "born" only after a name
_LABELLED_DOB = re.compile(r"(?i)\b" + _DOB_LABEL + r"\s*(?::|=|\bis\b|\bwas\b)?\s*(" + DATE + r")")
_BORN_DOB = re.compile(NAME + _BIRTH + r"(" + DATE + r")")


def names(text: str) -> Iterator[Span]:
    """(start, end, value_start, value_end) of every name in a record's context.  A name before
    its date of birth spans the name alone, so that the date is a value of its own."""
    for m in _LABELLED_NAME.finditer(text):
        g = 1 if m.start(1) >= 0 else 2
        yield m.start(), m.end(), m.start(g), m.end(g)
    for pattern in (_TITLED, _SIGNED):
        for m in pattern.finditer(text):
            yield m.start(), m.end(), m.start(1), m.end(1)
    for m in _NAME_BORN.finditer(text):
        yield m.start(1), m.end(1), m.start(1), m.end(1)


def dates_of_birth(text: str) -> Iterator[Span]:
    """(start, end, value_start, value_end) of every date announced as a date of birth (after a
    name, the date alone: the name is a value of its own)."""
    for m in _LABELLED_DOB.finditer(text):
        yield m.start(), m.end(), m.start(1), m.end(1)
    for m in _BORN_DOB.finditer(text):
        yield m.start(1), m.end(1), m.start(1), m.end(1)
