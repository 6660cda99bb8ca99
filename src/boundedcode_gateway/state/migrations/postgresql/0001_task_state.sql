-- The task state several gateways share (`state: postgresql://…`): the reasoning store and
-- the history behind the record's `changed`. Recorded in state_migrations, apart from the
-- ledger's schema_migrations, so both may live in one database.

-- One row per task that has reasoning stored. Its writers take the row in turn (the
-- upsert's row lock, held until commit), so the numbers they give their items become
-- visible in order: a reader that has seen up to `reasoning_seq` N has seen every item
-- numbered N or less. `epoch` is new each time the row is made, so a gateway holding the
-- items of a task that retention removed, and that was written to again, reads it afresh.
CREATE SEQUENCE state_task_epochs;

CREATE TABLE state_tasks (
    task TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL DEFAULT nextval('state_task_epochs'),
    reasoning_seq BIGINT NOT NULL,
    written_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX state_tasks_written_at ON state_tasks (written_at);

-- One turn's reasoning under one of its keys (reasoning_store/keys.py), of one kind
-- (llama.cpp's reasoning text, Anthropic's thinking blocks, Gemini's thought signatures).
-- `data` is the item's JSON as the gateway encoded it, so it comes back byte for byte.
CREATE TABLE state_reasoning (
    task TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    seq BIGINT NOT NULL,
    provider TEXT NOT NULL,
    profile TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (task, kind, key)
);

CREATE INDEX state_reasoning_task_seq ON state_reasoning (task, seq);

-- Per task and purpose, the digests of the last request's messages: 8 bytes a message,
-- signed 64-bit little-endian BLAKE2b (policy/history_diff.py). `version` is new for each
-- request, from a sequence over all rows (never the same twice, also after retention
-- removed a row), so a gateway that holds the version a request replaced is not sent its
-- digests.
CREATE SEQUENCE state_history_versions;

CREATE TABLE state_history (
    task TEXT NOT NULL,
    purpose TEXT NOT NULL,
    version BIGINT NOT NULL,
    digests BYTEA NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (task, purpose)
);

CREATE INDEX state_history_updated_at ON state_history (updated_at);
