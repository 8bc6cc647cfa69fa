-- Schema version 10 (issue 37): every secret-like value of a text, not only the first, as JSON
-- (sources/secrets.py values_json: kind, match and value spans, verified = its checksum holds),
-- for the secret attack to probe each; and whether the user marked the text public (a public
-- text holds nothing private: it is not searched for secrets and never "at risk").
ALTER TABLE examples ADD COLUMN secret_values VARCHAR;
ALTER TABLE examples ADD COLUMN public BOOLEAN;
