-- Access and cost: which caller credential made the call, and what it cost.
ALTER TABLE model_calls ADD COLUMN caller TEXT;
ALTER TABLE model_calls ADD COLUMN cost_usd DOUBLE PRECISION;
