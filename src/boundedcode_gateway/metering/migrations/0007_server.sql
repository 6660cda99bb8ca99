-- The local server of a pool that answered the call (docs/scaling.md).
ALTER TABLE model_calls ADD COLUMN server TEXT;
