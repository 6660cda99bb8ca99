-- One row per answer's reasoning, with every key it is found under (reasoning_store/keys.py)
-- in `keys`, where 0001 kept one row per key, each with a copy of the text: an answer with
-- 400 tool calls wrote its reasoning 400 times. `seq` now numbers answers; the rows of
-- 0001 that hold one text under one writer become one row, numbered as the last of them
-- (numbers stay unique per task and at most the task's `reasoning_seq`, so a gateway that
-- read up to N still finds every item numbered above N).
CREATE TABLE state_reasoning_answers (
    task TEXT NOT NULL,
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    keys TEXT[] NOT NULL,
    provider TEXT NOT NULL,
    profile TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (task, seq)
);

INSERT INTO state_reasoning_answers (task, seq, kind, keys, provider, profile, data)
SELECT task, max(seq), kind, array_agg(key ORDER BY seq), provider, profile, data
FROM state_reasoning
GROUP BY task, kind, provider, profile, data;

DROP TABLE state_reasoning;

ALTER TABLE state_reasoning_answers RENAME TO state_reasoning;
ALTER INDEX state_reasoning_answers_pkey RENAME TO state_reasoning_pkey;
