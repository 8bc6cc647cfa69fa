"""Every attack on an audited checkpoint and its defaults.  Each attack is an ``Attack`` (name, run,
store) run by ``run_attacks`` (``contract``); ``run_extraction`` (``run``) loads the models once and
runs the stored attacks (``stored``: greedy extraction, membership scores, discoverable extraction,
secret-like values); ``defaults`` holds the default rule.  ``forward`` holds the one batched
no-grad forward loop and ``decode`` the one greedy decoder that the attacks and studies share."""

from gnq_core._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".defaults": ("DEFAULT_ATTACK_BATCH", "DEFAULT_EXPOSURE_NODES", "DEFAULT_PREFIX", "DEFAULT_REFERENCE",
                  "DEFAULT_SECRET_CANDIDATES", "DEFAULT_SUFFIX", "DEFAULT_THRESHOLD", "FIRST_CHECKPOINT",
                  "MAX_SECRET_CANDIDATES", "MIN_SECRET_CANDIDATES", "PROTOCOL_PRESETS"),
    ".contract": ("Attack", "Target", "run_attacks"),
    ".extraction": ("AttackRule",),
    ".non_members": ("ground_truth_of", "membership_frame", "membership_of"),
    ".run": ("run_extraction",),
})
