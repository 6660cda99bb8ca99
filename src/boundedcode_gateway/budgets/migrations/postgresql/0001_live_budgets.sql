-- What each caller and each task spent, kept current by the ledger itself, and what the
-- calls in flight hold: the budgets several gateways share (docs/budgets.md). Recorded
-- in budget_migrations, apart from the ledger's and the task state's; applied after
-- the ledger's (the trigger is on model_calls).

-- Per holder ('caller' or 'task', its name) and UTC day ('YYYY-MM-DD'; '' for all
-- time): the sums of the ledger's rows, as the ledger's spending query adds them.
CREATE TABLE budget_spent (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    day TEXT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
    tokens BIGINT NOT NULL DEFAULT 0,
    evaluated_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, name, day)
);

-- What a call in flight holds of one holder's budget, until its ledger row is written
-- (the trigger below deletes it then) or, its gateway gone, until it expires.
CREATE TABLE budget_reservations (
    call_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    tokens BIGINT NOT NULL,
    evaluated_tokens BIGINT NOT NULL,
    gateway TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (call_id, kind, name)
);

CREATE INDEX budget_reservations_holder ON budget_reservations (kind, name);
CREATE INDEX budget_reservations_gateway ON budget_reservations (gateway);

-- A call's row in the ledger is what it spent: added to its caller's (the gateway's own
-- work has none) and its task's sums, its reservation let go, in the insert's own
-- transaction, so a call is counted once and only once it is in the ledger.
CREATE FUNCTION budget_settle() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    spent_day TEXT := substr(NEW.started_at, 1, 10);
    cost DOUBLE PRECISION := COALESCE(NEW.cost_usd, 0);
    tokens BIGINT := COALESCE(NEW.prompt_tokens, 0) + COALESCE(NEW.completion_tokens, 0);
    evaluated BIGINT := COALESCE(NEW.evaluated_tokens, 0);
BEGIN
    DELETE FROM budget_reservations WHERE call_id = NEW.call_id;
    INSERT INTO budget_spent AS s (kind, name, day, cost_usd, tokens, evaluated_tokens)
    SELECT h.kind, h.name, h.day, cost, tokens, evaluated
    FROM (VALUES ('task', NEW.task, spent_day), ('task', NEW.task, ''),
                 ('caller', NEW.caller, spent_day), ('caller', NEW.caller, '')) AS h(kind, name, day)
    WHERE h.name IS NOT NULL
    ON CONFLICT (kind, name, day) DO UPDATE SET
        cost_usd = s.cost_usd + EXCLUDED.cost_usd,
        tokens = s.tokens + EXCLUDED.tokens,
        evaluated_tokens = s.evaluated_tokens + EXCLUDED.evaluated_tokens;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER model_calls_budget_settle AFTER INSERT ON model_calls
    FOR EACH ROW EXECUTE FUNCTION budget_settle();

-- what the ledger held before
INSERT INTO budget_spent (kind, name, day, cost_usd, tokens, evaluated_tokens)
SELECT h.kind, h.name, h.day,
       SUM(COALESCE(m.cost_usd, 0)),
       SUM(COALESCE(m.prompt_tokens, 0) + COALESCE(m.completion_tokens, 0)),
       SUM(COALESCE(m.evaluated_tokens, 0))
FROM model_calls m
CROSS JOIN LATERAL (VALUES ('task', m.task, substr(m.started_at, 1, 10)), ('task', m.task, ''),
                           ('caller', m.caller, substr(m.started_at, 1, 10)), ('caller', m.caller, ''))
    AS h(kind, name, day)
WHERE h.name IS NOT NULL
GROUP BY h.kind, h.name, h.day;
