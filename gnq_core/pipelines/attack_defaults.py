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
# N: random values of a secret's format scored beside it; the exposure estimate is fitted to
# their likelihoods (pipelines/secret_attack.py), --secret-candidates
DEFAULT_SECRET_CANDIDATES = 128
