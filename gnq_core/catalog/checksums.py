"""The checks a value's format carries: payment cards' Luhn digit, IBANs' ISO 7064 mod 97 check
digits, and the check characters either one recomputes from the rest (what an exposure's
candidate space derives instead of counting as free).  python-stdnum implements the
standards (and many more: national IDs, VAT numbers), kept up to date by its maintainers; it is
imported on first use (its package pulls in pydoc: 0.3 s that a page reading only the catalog's
words need not pay)."""

from __future__ import annotations


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies (``digits``: digits only)."""
    from stdnum import luhn

    return digits.isdigit() and luhn.is_valid(digits)


def luhn_digit(body: str) -> str:
    """The Luhn check digit that completes ``body`` (digits only)."""
    from stdnum import luhn

    return luhn.calc_check_digit(body)


def iban_ok(iban: str) -> bool:
    """ISO 13616 check digits (mod 97 == 1), on the IBAN with or without spaces.  Only the check
    digits are tested, not each country's length and bank-code rules: a labelled test IBAN of a
    country stdnum does not list still verifies by its digits."""
    from stdnum import iban as standard
    from stdnum.exceptions import ValidationError

    compact = iban.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34 or not compact[:2].isalpha() or not compact[2:4].isdigit():
        return False
    try:
        standard.validate(compact, check_country=False)
    except ValidationError:
        return False
    return True


def iban_check_digits(compact: str) -> str:
    """The two check digits (characters 3-4) of an IBAN whose other characters are ``compact``'s."""
    from stdnum import iban as standard

    return standard.calc_check_digits(compact)
