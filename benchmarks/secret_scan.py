"""The secret-like scan and the format check on hostile inputs: time against size, in one run.

* ``find_secrets`` on texts made of one repeated piece ("ab-" made the e-mail regex retry every
  word boundary; "pin: 1234 key: 12345" checked each generic value against every kept one) at
  100, 200 and 400 KB: linear when doubling the text doubles the time.
* The e-mail regex the scan replaced against the scan (``_emails``), on "ab-" of 10, 20 and 40 KB.
* ``format_places`` once per value against all the others (how the attack called it) against
  ``format_places_of`` (counted once per kind), at 500, 1,000 and 2,000 values.

    PYTHONPATH=$PWD python -m benchmarks.secret_scan
"""

from __future__ import annotations

import random
import re
import time

from benchmarks.common import interleaved, write

PIECES = ["ab-", "eyJa-", "pin: 1234 key: 12345 ", "The model reads every text once. "]
EMAIL = re.compile(r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b")


def _text(piece: str, n: int) -> str:
    return (piece * (n // len(piece) + 1))[:n]


def main() -> None:
    from gnq_core.attacks.secret_attack import format_places, format_places_of
    from gnq_core.catalog.scans import emails as _emails
    from gnq_core.sources.secrets import find_secrets

    scan = {}
    for piece in PIECES:
        texts = {f"{n // 1000} KB": _text(piece, n) for n in (100_000, 200_000, 400_000)}
        runs = interleaved({k: (lambda t=t: find_secrets(t)) for k, t in texts.items()}, repeats=3,
                           clock=time.process_time)
        scan[piece] = {k: v["median_s"] for k, v in runs.items()}
    email = {}
    for n in (10_000, 20_000, 40_000):
        t = _text("ab-", n)
        runs = interleaved({"regex": lambda t=t: list(EMAIL.finditer(t)),
                            "scan": lambda t=t: list(_emails(t))}, repeats=3, clock=time.process_time)
        email[f"{n // 1000} KB"] = {k: v["median_s"] for k, v in runs.items()}
    places = {}
    rng = random.Random(0)
    for n in (500, 1000, 2000):
        values = {f"+44 20 7946 {rng.randrange(10_000):04d}" for _ in range(n)}
        runs = interleaved({"per value": lambda v=values: [format_places(x, sorted(v - {x})) for x in v],
                            "once per kind": lambda v=values: format_places_of(v)}, repeats=3,
                           clock=time.process_time)
        places[f"{len(values)} values"] = {k: v["median_s"] for k, v in runs.items()}
    path = write("secret_scan", {"unit": "CPU seconds (process_time), median of 3", "find_secrets": scan,
                                 "email_regex_vs_scan": email, "format_places": places})
    print(path.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
