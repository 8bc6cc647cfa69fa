-- Schema version 17: "exposed" at a stated false-alarm rate (attacks/exposure_fdr.py).  Each
-- value's p-value (2^-exposure for an exact rank; an estimate's upper bound), the run's
-- false-discovery rate q it was decided at (Benjamini-Hochberg across the run's values), and the
-- reference model as a likelihood-ratio test: the value's log-likelihood audited - reference and
-- its p-value among never-trained values of its format.  Rows written before this version have
-- these NULL: their "exposed" compared the exposure with the null's 99th percentile and the
-- reference's exposure.
ALTER TABLE secret_attacks ADD COLUMN exposure_p DOUBLE;          -- P(rank this good | never trained)
ALTER TABLE secret_attacks ADD COLUMN log_ratio DOUBLE;           -- log-likelihood audited - reference (nats)
ALTER TABLE secret_attacks ADD COLUMN reference_ratio_p DOUBLE;   -- share of never-trained ratios >= it
ALTER TABLE secret_attacks ADD COLUMN exposure_fdr_q DOUBLE;      -- the false-discovery rate decided at
ALTER TABLE secret_exposure_null ADD COLUMN log_ratio DOUBLE;
