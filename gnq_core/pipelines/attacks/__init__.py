"""The attacks' entrance: every attack on an audited checkpoint is an ``Attack`` (name, run,
store) run by ``run_attacks`` (``contract``); ``run_extraction`` (``run``) loads the models once
and runs the stored attacks (``stored``: greedy extraction, membership scores, discoverable
extraction, secret-like values).  ``forward`` holds the one batched no-grad forward loop and
``decode`` the one greedy decoder that the attacks and studies share.  Import the modules
themselves (this package imports nothing, so any of them can be imported first)."""
