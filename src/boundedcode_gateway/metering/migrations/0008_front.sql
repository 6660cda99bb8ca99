-- The API the caller spoke: chat completions, or another front (docs/fronts.md).
ALTER TABLE model_calls ADD COLUMN front TEXT NOT NULL DEFAULT 'chat';
