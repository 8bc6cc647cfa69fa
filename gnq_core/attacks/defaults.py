"""The extraction attack's default rule, in one place (``gnq extract``, the dashboard's form, the
demo, ``ExtractJob`` and ``run_extraction`` all take it from here): reveal 12 tokens, require
exactly the next 8 (k-extractability, Carlini et al.), all of them, calibrated against the run's
first checkpoint.  Light on purpose: the CLI reads it for its --help without importing torch."""

FIRST_CHECKPOINT = "first"  # ``reference``: the run's first finished checkpoint
DEFAULT_PREFIX, DEFAULT_SUFFIX = 12, 8
DEFAULT_THRESHOLD = 1.0  # the share of the suffix tokens that must match (1: all)
DEFAULT_REFERENCE = FIRST_CHECKPOINT
DEFAULT_ATTACK_BATCH = 32  # texts decoded together
# (p, s) of the protocols `gnq extract --preset` compares with: this tool's default, Pythia's
# memorisation studies, Carlini et al.'s extraction benchmark.
PROTOCOL_PRESETS = {"12/8": (DEFAULT_PREFIX, DEFAULT_SUFFIX), "32/32": (32, 32), "50/50": (50, 50)}
# N: random values of a secret's space scored beside it when its exact rank is out of reach; the
# exposure estimate is fitted to their likelihoods (attacks/exposure.py), --secret-candidates.
# 1 turns exposure off; fewer than MIN cannot fit an estimate; more than MAX is refused (a space
# smaller than N is scored whole instead).
DEFAULT_SECRET_CANDIDATES = 128
MIN_SECRET_CANDIDATES, MAX_SECRET_CANDIDATES = 20, 65_536
# Token prefixes the exact-rank search may expand per value before the estimate takes over,
# --exposure-nodes.  benchmarks/exposure_search.py on SmolLM2-135M, CPU (2 busy cores): a memorised
# 6-digit value is ranked exactly in 14 nodes (4 s), a node costs ~0.11 s; 1,024 nodes bound a
# value's search near 2 minutes there, ~30× what a memorised 16-digit card needs (2 per digit).
DEFAULT_EXPOSURE_NODES = 1024
MAX_EXPOSURE_NODES = 10_000_000
