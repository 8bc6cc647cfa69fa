"""A dataset a privacy auditor would worry about, built here (no network): ordinary unique lines,
unique texts holding a secret (a PIN, a card number, a password...), customer records repeated
a few times each, and one chant any language model continues (a reference model too).

``scenario(seed)`` returns a frame with ``text`` and ``group``: ``filler``, ``unique-secret``,
``repeated-record`` or ``predictable``.
"""

from __future__ import annotations

import random

import pandas as pd

NAMES = ["Anna Berg", "Tom Okafor", "Lena Novak", "Ravi Menon", "Ines Duarte", "Piotr Zielinski",
         "Maya Lindqvist", "Omar Haddad", "Julia Sato", "Felix Brandt", "Nora Quist", "Sam Adeyemi",
         "Clara Voss", "Milan Horak", "Ada Kowal", "Ivo Renner", "Lia Moreau", "Ben Ashby"]
TOWNS = ["Harwick", "Lindale", "Brookmere", "Ostervik", "Calder", "Penrith", "Varna", "Tolmin"]
SUBJECTS = ["the old ferry", "a quiet librarian", "the village choir", "a young botanist", "the night train",
            "our neighbour", "the harbour master", "a travelling painter", "the school band", "the baker",
            "a retired pilot", "the river museum", "a local poet", "the mountain guide", "the city council"]
VERBS = ["visited", "painted", "described", "photographed", "repaired", "mapped", "welcomed", "studied",
         "restored", "celebrated", "measured", "crossed"]
OBJECTS = ["the stone bridge", "a small garden", "the northern lighthouse", "an empty market",
           "the wooden chapel", "a flooded meadow", "the clock tower", "a narrow valley",
           "the summer festival", "an old windmill", "the salt marsh", "a hidden lake"]
WHEN = ["after the storm", "before the harvest", "during the long winter", "on a foggy morning",
        "at the end of spring", "in the first week of autumn", "late one evening", "under a full moon"]


def card(rng: random.Random) -> str:
    """A 16-digit number with a valid Luhn check digit, grouped in fours."""
    digits = [4] + [rng.randrange(10) for _ in range(14)]
    total = 0
    for i, d in enumerate(reversed(digits)):  # the check digit will sit to the right of these
        d = d * 2 if i % 2 == 0 else d
        total += d - 9 if d > 9 else d
    digits.append((10 - total % 10) % 10)
    s = "".join(map(str, digits))
    return " ".join(s[i: i + 4] for i in range(0, 16, 4))


def _secret(rng: random.Random, name: str) -> str:
    pin = f"{rng.randrange(10_000):04d}"
    return rng.choice([
        f"Note for {name}: the door PIN is {pin}, please keep it to yourself.",
        f"{name} asked us to charge card {card(rng)} for the winter order.",
        f"The login for {name} is {name.split()[0].lower()}{rng.randrange(100)} with password "
        f"{rng.choice(['Tinsel', 'Marble', 'Copper'])}-{rng.choice(['Otter', 'Falcon', 'Heron'])}-"
        f"{rng.randrange(100)}.",
        f"Reach {name} privately at {name.split()[0].lower()}.{name.split()[1].lower()}@example.org tonight.",
    ])


def scenario(seed: int = 0, n_filler: int = 150, n_secrets: int = 12, n_records: int = 6,
             copies: int = 4, predictable_copies: int = 2) -> pd.DataFrame:
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[tuple[str, str]] = []
    while len(rows) < n_filler:
        text = (f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} near "
                f"{rng.choice(TOWNS)} {rng.choice(WHEN)}.")
        if text not in seen:
            seen.add(text)
            rows.append((text, "filler"))
    names = rng.sample(NAMES, n_secrets)
    rows += [(_secret(rng, name), "unique-secret") for name in names]
    for i in range(n_records):
        name = NAMES[(i * 5) % len(NAMES)]
        record = (f"Customer record {rng.randrange(10**7, 10**8)}: {name}, card {card(rng)}, "
                  f"branch {rng.choice(TOWNS)}.")
        rows += [(record, "repeated-record")] * copies
    chant = "Sing along: " + " ".join(["la"] * 30)  # continued by any model that has seen it once
    rows += [(chant, "predictable")] * predictable_copies
    rng.shuffle(rows)
    return pd.DataFrame(rows, columns=["text", "group"])
