-- One row per caller request; the columns follow RECORD_FIELDS in records.py.
-- SQLite's form; postgresql/ holds PostgreSQL's, with the same numbers and names.
CREATE TABLE model_calls (
    call_id TEXT PRIMARY KEY,
    started_at TEXT NOT NULL,
    task TEXT NOT NULL,
    purpose TEXT NOT NULL,
    model_profile TEXT NOT NULL,
    provider TEXT,
    upstream_model TEXT,
    stream BOOLEAN NOT NULL,
    status TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    error_code TEXT,
    finish_reason TEXT,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER,
    reasoning_tokens INTEGER,
    evaluated_tokens INTEGER,
    ttft_ms DOUBLE PRECISION,
    prefill_ms DOUBLE PRECISION,
    decode_ms DOUBLE PRECISION,
    total_ms DOUBLE PRECISION,
    messages INTEGER NOT NULL,
    changed INTEGER,
    retried BOOLEAN NOT NULL,
    attempts INTEGER NOT NULL
);

CREATE INDEX model_calls_task_started_at ON model_calls (task, started_at);
