-- The cache: what the previous call left reusable, why this one missed, and a derived TTFT.
ALTER TABLE model_calls ADD COLUMN reusable_tokens BIGINT;
ALTER TABLE model_calls ADD COLUMN miss_cause TEXT;
ALTER TABLE model_calls ADD COLUMN ttft_derived BOOLEAN NOT NULL DEFAULT FALSE;
