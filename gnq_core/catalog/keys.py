"""API keys and tokens of any vendor, as secret scanners find them (detect-secrets' and
gitleaks' generic rules): a vendor-style prefix ("sk-", "pk_live_", "tok-") or a keyword
("key", "token", "secret", "bearer") followed by a long run of characters whose Shannon entropy
is that of random text, not of a word or a number.  The known vendors' exact formats stay in the
catalog's entry beside this rule (catalog/kinds.py)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator

from gnq_core.catalog.detectors import Span

MIN_RUN = 20          # random characters after the prefix: 20 base62 characters = 119 bits
MIN_ENTROPY = 3.5     # bits per character of the run (a random base62 run of 20-40 has 4.0-4.9)


def entropy(run: str) -> float:
    """Shannon entropy of the run's characters, bits per character."""
    counts = Counter(run)
    return -sum(n / len(run) * math.log2(n / len(run)) for n in counts.values())


def random_like(run: str) -> bool:
    """A run that reads as random: at least ``MIN_RUN`` characters, with the entropy of random text
    (``MIN_ENTROPY`` with both cases; 4 bits, above any hex digest's ceiling, with one case only),
    and digits among its letters, or without digits cases that switch as often as chance has them
    (a random base62 run switches every other letter; a CamelCase name once a word).  A word, a
    CamelCase name or a long number fails."""
    letters = sum(c.isalpha() for c in run)
    digits = sum(c.isdigit() for c in run)
    if len(run) < MIN_RUN or letters < 4:
        return False
    mixed_case = not run.isupper() and not run.islower()
    if not digits:
        cased = [c.isupper() for c in run if c.isalpha()]
        switches = sum(a != b for a, b in zip(cased, cased[1:], strict=False))
        if not mixed_case or switches < len(cased) / 4:
            return False
    return entropy(run) >= (MIN_ENTROPY if mixed_case else 4.0)


# "sk-", "sk_test_", "pk-proj-", "tok_", "rk-live-": 1-8 letters, a dash or underscore, optionally a
# second word of letters and a separator, then the run
_RUN = r"([A-Za-z0-9]{" + str(MIN_RUN) + r",})"
_PREFIXED = re.compile(r"(?<![\w-])(?:[a-z]{1,8}|[A-Z]{2,8})[_-](?:[a-z]{2,8}[_-])?" + _RUN + r"(?![\w-])")
_KEYWORD = re.compile(r"(?i)\b(?:api[ _-]?key|key|token|secret|bearer|authorization|credential)s?\b"
                      r"[^\n\w]{0,4}(?:\w+[^\n\w]{1,3}){0,2}?([A-Za-z0-9_\-+/=]{" + str(MIN_RUN)
                      + r",})(?![\w-])")


def generic_keys(text: str) -> Iterator[Span]:
    """(start, end, value_start, value_end) of each prefixed or announced random-looking run; the
    value is the whole key, its prefix included ("sk-…"), as a user would paste it."""
    for m in _PREFIXED.finditer(text):
        if random_like(m.group(1)):
            yield m.start(), m.end(), m.start(), m.end()
    for m in _KEYWORD.finditer(text):
        run = m.group(1)
        if random_like(re.sub(r"[_\-+/=]", "", run)):
            yield m.start(), m.end(), m.start(1), m.end(1)
