"""The research behind GNQ Audit, kept in the repository and not installed with the package: the
paper's studies (``research.studies``, run by ``gnq study ...`` from a clone).  It imports
gnq_core's public names; nothing in gnq_core imports it but ``gnq study``'s guarded import."""
