"""The research behind GNQ Audit, kept in the repository and not installed with the package: the
paper's studies (``research.studies``, run by ``python -m research study ...`` from a clone:
research/cli.py).  It imports gnq_core's public names; nothing in gnq_core imports it (the
deprecated ``gnq study`` forwarder finds the program by name at run time)."""
