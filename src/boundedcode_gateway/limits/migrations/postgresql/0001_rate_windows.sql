-- The rate limits' windows several gateways share (limits/windows.py): per holder
-- ('caller', 'task' or 'profile', its name) and metric ('requests', 'tokens',
-- 'evaluated_tokens'), the fixed window that begins at `start` (seconds since the epoch,
-- by the database's clock) and what it and the one before it counted.
CREATE TABLE rate_windows (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    metric TEXT NOT NULL,
    start DOUBLE PRECISION NOT NULL,
    current BIGINT NOT NULL,
    previous BIGINT NOT NULL,
    touched_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, name, metric)
);

CREATE INDEX rate_windows_touched_at ON rate_windows (touched_at);
