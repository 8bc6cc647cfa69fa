-- Schema version 11 (10 is batch_gnq_mode, written on another branch at the same time): every secret-like value of
-- a text, not only the first, as JSON (sources/secrets.py values_json: kind, match and value spans, verified = its checksum holds),
-- for the secret attack to probe each; and whether the user marked the text public (a public
-- text holds nothing private: it is not searched for secrets and never "at risk").
ALTER TABLE examples ADD COLUMN secret_values VARCHAR;
ALTER TABLE examples ADD COLUMN public BOOLEAN;
-- Of the letters and digits the audited model wrote at their place, those the value's format does
-- not explain: where the value differs from what the other values of its kind in the run have at
-- that place ("+44 20 7946" that every phone number of a data set shares is the format, not the
-- secret). NULL: attacked before this version (all of them count).
ALTER TABLE secret_attacks ADD COLUMN novel_chars_reproduced INTEGER;
