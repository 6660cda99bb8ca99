-- One row per caller request; the columns follow RECORD_FIELDS in records.py.
-- PostgreSQL's form of ../0001_model_calls.sql: every count BIGINT (what SQLite's INTEGER
-- holds), times DOUBLE PRECISION, flags BOOLEAN. `seq` is the insertion order, which SQLite
-- keeps as its rowid: it orders calls started in the same millisecond.
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
    http_status BIGINT NOT NULL,
    error_code TEXT,
    finish_reason TEXT,
    prompt_tokens BIGINT,
    cached_tokens BIGINT,
    completion_tokens BIGINT,
    reasoning_tokens BIGINT,
    evaluated_tokens BIGINT,
    ttft_ms DOUBLE PRECISION,
    prefill_ms DOUBLE PRECISION,
    decode_ms DOUBLE PRECISION,
    total_ms DOUBLE PRECISION,
    messages BIGINT NOT NULL,
    changed BIGINT,
    retried BOOLEAN NOT NULL,
    attempts BIGINT NOT NULL,
    seq BIGINT GENERATED ALWAYS AS IDENTITY
);

CREATE INDEX model_calls_task_started_at ON model_calls (task, started_at);
