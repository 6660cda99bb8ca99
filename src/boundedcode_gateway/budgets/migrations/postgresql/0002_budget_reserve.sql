-- A call's reservation in one statement (budgets/shared.py): the holders locked, their
-- sums and the live reservations read, the call judged and its reservations written,
-- all on the database, so that a call waits for one round trip instead of one per step
-- of a transaction (its start, a lock per holder, the read, the insert, the commit).

-- limits.fitting for one holder, to the bit: the same float8 operations in the same
-- order (each limit's left is allowed - spent - reserved, counts converted to float8 as
-- Python converts ints, a token count held at most int(left)). `over` lists the limits
-- the call does not fit in (BudgetSettings' field names, in fitting's order); the held_*
-- columns are what it holds where it fits. A NULL limit is no limit.
CREATE FUNCTION budget_fitting(
    max_cost DOUBLE PRECISION, max_tokens BIGINT, max_evaluated BIGINT,
    spent_cost DOUBLE PRECISION, spent_tokens BIGINT, spent_evaluated BIGINT,
    reserved_cost DOUBLE PRECISION, reserved_tokens BIGINT, reserved_evaluated BIGINT,
    ask_cost DOUBLE PRECISION, ask_tokens BIGINT, ask_evaluated BIGINT, hard BOOLEAN,
    OUT over TEXT[], OUT held_cost DOUBLE PRECISION, OUT held_tokens BIGINT,
    OUT held_evaluated BIGINT
) LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    room DOUBLE PRECISION;
BEGIN
    over := '{}';
    held_cost := ask_cost;
    held_tokens := ask_tokens;
    held_evaluated := ask_evaluated;
    IF max_cost IS NOT NULL THEN
        room := max_cost - spent_cost - reserved_cost;
        IF room <= 0 OR (hard AND ask_cost > room) THEN
            over := over || 'max_cost_usd'::TEXT;
        ELSIF ask_cost > room THEN
            held_cost := room;
        END IF;
    END IF;
    IF max_tokens IS NOT NULL THEN
        room := max_tokens::DOUBLE PRECISION - spent_tokens::DOUBLE PRECISION
            - reserved_tokens::DOUBLE PRECISION;
        IF room <= 0 OR (hard AND ask_tokens::DOUBLE PRECISION > room) THEN
            over := over || 'max_tokens'::TEXT;
        ELSIF ask_tokens::DOUBLE PRECISION > room THEN
            held_tokens := trunc(room)::BIGINT;
        END IF;
    END IF;
    IF max_evaluated IS NOT NULL THEN
        room := max_evaluated::DOUBLE PRECISION - spent_evaluated::DOUBLE PRECISION
            - reserved_evaluated::DOUBLE PRECISION;
        IF room <= 0 OR (hard AND ask_evaluated::DOUBLE PRECISION > room) THEN
            over := over || 'max_evaluated_tokens'::TEXT;
        ELSIF ask_evaluated::DOUBLE PRECISION > room THEN
            held_evaluated := trunc(room)::BIGINT;
        END IF;
    END IF;
END
$fn$;

-- One call (`call`, of gateway `gateway_name`, its reservations living `ttl_s`) asking
-- `ask_*` of the budgets of holders kinds[i]/names[i] (lock_keys[i]: the advisory lock
-- key of 'budget:kind:name'; lifetimes[i]: held to its lifetime sums, else to today's,
-- `today` being 'YYYY-MM-DD'; max_*[i]: its limits, NULL where none). One row per
-- holder, in their order: what it spent today and in all and what the live
-- reservations hold of it, as judged; the limits the call does not fit in; what the
-- call holds of it (NULL where nothing was reserved); whether the call was reserved,
-- which it is in every holder or in none.
CREATE FUNCTION budget_reserve(
    call TEXT, gateway_name TEXT, ttl_s DOUBLE PRECISION, today TEXT,
    lock_keys BIGINT[], kinds TEXT[], names TEXT[], lifetimes BOOLEAN[],
    max_costs DOUBLE PRECISION[], max_tokens BIGINT[], max_evaluated BIGINT[],
    ask_cost DOUBLE PRECISION, ask_tokens BIGINT, ask_evaluated BIGINT, hard BOOLEAN
) RETURNS TABLE (
    day_cost DOUBLE PRECISION, day_tokens BIGINT, day_evaluated BIGINT,
    lifetime_cost DOUBLE PRECISION, lifetime_tokens BIGINT, lifetime_evaluated BIGINT,
    reserved_cost DOUBLE PRECISION, reserved_tokens BIGINT, reserved_evaluated BIGINT,
    over TEXT[], held_cost DOUBLE PRECISION, held_tokens BIGINT, held_evaluated BIGINT,
    reserved BOOLEAN
) LANGUAGE plpgsql AS $fn$
DECLARE
    lock_key BIGINT;
BEGIN
    -- in one order whatever the call's, so two calls never wait on each other
    FOREACH lock_key IN ARRAY ARRAY(SELECT DISTINCT k FROM unnest(lock_keys) AS k ORDER BY k) LOOP
        PERFORM pg_advisory_xact_lock(lock_key);
    END LOOP;
    -- A statement of its own, after the locks: it sees what was committed when it
    -- began. Its judgement is computed once, so what it writes and what it returns agree.
    RETURN QUERY
    WITH seen AS (
        SELECT h.n, h.kind, h.name, h.lifetime, h.max_cost, h.max_tok, h.max_eval,
               COALESCE(d.cost_usd, 0) AS d_cost, COALESCE(d.tokens, 0) AS d_tokens,
               COALESCE(d.evaluated_tokens, 0) AS d_evaluated,
               COALESCE(l.cost_usd, 0) AS l_cost, COALESCE(l.tokens, 0) AS l_tokens,
               COALESCE(l.evaluated_tokens, 0) AS l_evaluated,
               COALESCE(r.cost_usd, 0) AS r_cost, COALESCE(r.tokens, 0)::BIGINT AS r_tokens,
               COALESCE(r.evaluated_tokens, 0)::BIGINT AS r_evaluated
        FROM unnest(kinds, names, lifetimes, max_costs, max_tokens, max_evaluated)
            WITH ORDINALITY AS h(kind, name, lifetime, max_cost, max_tok, max_eval, n)
        LEFT JOIN budget_spent d ON d.kind = h.kind AND d.name = h.name AND d.day = today
        LEFT JOIN budget_spent l ON l.kind = h.kind AND l.name = h.name AND l.day = ''
        LEFT JOIN LATERAL (
            SELECT SUM(b.cost_usd) AS cost_usd, SUM(b.tokens) AS tokens,
                   SUM(b.evaluated_tokens) AS evaluated_tokens
            FROM budget_reservations b
            WHERE b.kind = h.kind AND b.name = h.name AND b.expires_at > now()
        ) r ON true
    ), judged AS MATERIALIZED (
        SELECT s.*, f.over AS f_over, f.held_cost AS f_cost, f.held_tokens AS f_tokens,
               f.held_evaluated AS f_evaluated
        FROM seen s
        CROSS JOIN LATERAL budget_fitting(
            s.max_cost, s.max_tok, s.max_eval,
            CASE WHEN s.lifetime THEN s.l_cost ELSE s.d_cost END,
            CASE WHEN s.lifetime THEN s.l_tokens ELSE s.d_tokens END,
            CASE WHEN s.lifetime THEN s.l_evaluated ELSE s.d_evaluated END,
            s.r_cost, s.r_tokens, s.r_evaluated,
            ask_cost, ask_tokens, ask_evaluated, hard
        ) f
    ), verdict AS (
        SELECT bool_and(cardinality(j.f_over) = 0) AS fits FROM judged j
    ), written AS (
        INSERT INTO budget_reservations
            (call_id, kind, name, cost_usd, tokens, evaluated_tokens, gateway, expires_at)
        SELECT call, j.kind, j.name, j.f_cost, j.f_tokens, j.f_evaluated, gateway_name,
               now() + make_interval(secs => ttl_s)
        FROM judged j, verdict v
        WHERE v.fits
    )
    SELECT j.d_cost, j.d_tokens, j.d_evaluated, j.l_cost, j.l_tokens, j.l_evaluated,
           j.r_cost, j.r_tokens, j.r_evaluated, j.f_over,
           CASE WHEN v.fits THEN j.f_cost END, CASE WHEN v.fits THEN j.f_tokens END,
           CASE WHEN v.fits THEN j.f_evaluated END, v.fits
    FROM judged j, verdict v
    ORDER BY j.n;
END
$fn$;
