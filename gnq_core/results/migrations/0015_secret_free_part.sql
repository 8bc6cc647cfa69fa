-- Schema version 15: a partial leak measured on the value's free part (attacks/partial_leak.py):
-- what neither the run's template nor the kind's format fixes.  novel_chars_reproduced now counts
-- the free characters written in place (the kind's prefix and check digits no longer count);
-- free_chars how many there are; free_null_mean what a never-trained value of the same kind and
-- template matches of the same writing on average, and free_null_p the chance it matches at least
-- as many (exact).  NULL on rows attacked before this version: "partly leaked" keeps its old rule
-- there (results/store_schema.py).
ALTER TABLE secret_attacks ADD COLUMN free_chars INTEGER;
ALTER TABLE secret_attacks ADD COLUMN free_null_mean DOUBLE;
ALTER TABLE secret_attacks ADD COLUMN free_null_p DOUBLE;
