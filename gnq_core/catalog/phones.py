"""Phone numbers against real numbering plans (Google's libphonenumber metadata, offline, via
``phonenumbers``): a number written with its country code is checked in that country's plan; a
national one ("(020) 7946 0958", "030 1234567") in the plan of any of ``NATIONAL_REGIONS``.  A
string with the shape of a phone number but no valid number behind it (a date range, a score, a
product code, a fictional 555 number) is not one."""

from __future__ import annotations

# The plans a number without a country code is tried in: the countries whose national formats the
# project's users' data mostly holds (one valid reading is enough).
NATIONAL_REGIONS = ("US", "GB", "DE", "FR", "ES", "IT", "NL", "IN", "CA", "AU", "IE", "CH", "AT", "BR", "MX")


def plan_valid(found: str) -> bool:
    """Whether ``found`` is a valid number of a real numbering plan (module docstring)."""
    import phonenumbers  # on first use: its metadata loads per region as numbers are parsed

    text = found.strip()
    regions = (None,) if text.startswith("+") else NATIONAL_REGIONS
    for region in regions:
        try:
            number = phonenumbers.parse(text, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return True
    return False
