"""What every layer shares and none owns: replacing a file atomically (``atomic``), strings made
safe for a terminal (``terminal``), progress of long jobs (``progress``), one interruption however
many signals arrive (``interrupts``), the checks every settings object runs on its values
(``values``) and the runtime facts the commands share: device, dtype, code version, seeding
(``runtime``).

A floor of its own under every package but the catalog: it imports nothing of gnq_core but
``gnq_core.errors``.  Kept free of heavy imports at package level, since ``import gnq_core``
reaches ``interrupts`` before anything else."""
