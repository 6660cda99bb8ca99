-- A call's windows admitted in one statement (limits/shared.py): the rows made to exist,
-- locked, judged and written on the database, so that a call waits for one round trip
-- instead of one per step of a transaction (its start, the rows made, the lock and
-- read, the write, the commit).

-- windows.admit for one window, to the bit: the same float8 operations in the same
-- order (rolled, _previous_weight, _fits). Python's round() of a float and PostgreSQL's
-- round(float8) both round half to even; floor(now / window) - round(start / window) is
-- computed in float8, whose rounding keeps its sign and whether it is 1, all that is
-- asked of it. The estimate is compared with the integer room left exactly, as Python
-- compares a float with an int: x <= room is ceil(x) <= room, in BIGINT, so a room past
-- 2^53 is not rounded. counted_* is the state to keep where `allowed`.
CREATE FUNCTION rate_window_admit(
    start DOUBLE PRECISION, current BIGINT, previous BIGINT,
    window_limit BIGINT, window_s DOUBLE PRECISION, now_s DOUBLE PRECISION, amount BIGINT,
    OUT allowed BOOLEAN, OUT counted_start DOUBLE PRECISION, OUT counted_current BIGINT,
    OUT counted_previous BIGINT
) LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    window_now DOUBLE PRECISION := floor(now_s / window_s);
    steps DOUBLE PRECISION := window_now - round(start / window_s);
    weight DOUBLE PRECISION;
    estimate DOUBLE PRECISION;
    room BIGINT;
BEGIN
    counted_start := start;
    counted_current := current;
    counted_previous := previous;
    IF steps > 0 THEN
        counted_start := window_now * window_s;
        counted_current := 0;
        counted_previous := CASE WHEN steps = 1 THEN current ELSE 0 END;
    END IF;
    weight := 1.0::DOUBLE PRECISION - least(greatest(
        now_s / window_s - round(counted_start / window_s), 0.0::DOUBLE PRECISION
    ), 1.0::DOUBLE PRECISION);
    estimate := counted_previous::DOUBLE PRECISION * weight;
    room := window_limit - counted_current - amount;
    allowed := room >= 0 AND CASE
        -- past every BIGINT: more than any room
        WHEN ceil(estimate) >= 9223372036854775808::DOUBLE PRECISION THEN false
        ELSE ceil(estimate)::BIGINT <= room
    END;
    IF allowed THEN
        counted_current := counted_current + amount;
    END IF;
END
$fn$;

-- One call's asks: window kinds[i]/names[i]/metrics[i] (distinct), at most limits[i] in
-- windows_s[i] seconds, asked amounts[i]. One row per ask, in their order: the row's
-- state as judged (a row made just now: 0, 0, 0), whether the ask fits, the database's
-- time it was judged at (seconds since the epoch), and whether the call was admitted,
-- which it is in every window or in none; only then are the windows written.
CREATE FUNCTION rate_admit(
    kinds TEXT[], names TEXT[], metrics TEXT[],
    limits BIGINT[], windows_s DOUBLE PRECISION[], amounts BIGINT[]
) RETURNS TABLE (
    seen_start DOUBLE PRECISION, seen_current BIGINT, seen_previous BIGINT,
    allowed BOOLEAN, now_s DOUBLE PRECISION, admitted BOOLEAN
) LANGUAGE plpgsql AS $fn$
DECLARE
    judged_at DOUBLE PRECISION := extract(epoch FROM now())::DOUBLE PRECISION;
BEGIN
    -- In one order whatever the call's (the keys' code points, as Python sorts them), so
    -- two calls never wait on each other: the rows a call inserts, then those it locks.
    INSERT INTO rate_windows (kind, name, metric, start, current, previous)
    SELECT k.kind, k.name, k.metric, 0, 0, 0
    FROM unnest(kinds, names, metrics) AS k(kind, name, metric)
    ORDER BY k.kind COLLATE "C", k.name COLLATE "C", k.metric COLLATE "C"
    ON CONFLICT (kind, name, metric) DO NOTHING;
    PERFORM 1
    FROM unnest(kinds, names, metrics) AS k(kind, name, metric)
    JOIN rate_windows w ON w.kind = k.kind AND w.name = k.name AND w.metric = k.metric
    ORDER BY k.kind COLLATE "C", k.name COLLATE "C", k.metric COLLATE "C"
    FOR UPDATE OF w;
    -- A statement of its own, after the locks: it sees the rows as the last call left
    -- them. A row swept since it was made (untouched for two days, so two windows or
    -- more behind) is judged as the new row it would be, and written again.
    RETURN QUERY
    WITH judged AS MATERIALIZED (
        SELECT k.n, k.kind, k.name, k.metric,
               COALESCE(w.start, 0) AS s_start, COALESCE(w.current, 0) AS s_current,
               COALESCE(w.previous, 0) AS s_previous, f.*
        FROM unnest(kinds, names, metrics, limits, windows_s, amounts)
            WITH ORDINALITY AS k(kind, name, metric, lim, win, amount, n)
        LEFT JOIN rate_windows w
            ON w.kind = k.kind AND w.name = k.name AND w.metric = k.metric
        CROSS JOIN LATERAL rate_window_admit(
            COALESCE(w.start, 0), COALESCE(w.current, 0), COALESCE(w.previous, 0),
            k.lim, k.win, judged_at, k.amount
        ) f
    ), verdict AS (
        SELECT bool_and(j.allowed) AS fits FROM judged j
    ), written AS (
        INSERT INTO rate_windows AS w (kind, name, metric, start, current, previous)
        SELECT j.kind, j.name, j.metric, j.counted_start, j.counted_current,
               j.counted_previous
        FROM judged j, verdict v
        WHERE v.fits
        ON CONFLICT (kind, name, metric) DO UPDATE
        SET start = EXCLUDED.start, current = EXCLUDED.current,
            previous = EXCLUDED.previous, touched_at = now()
    )
    SELECT j.s_start, j.s_current, j.s_previous, j.allowed, judged_at, v.fits
    FROM judged j, verdict v
    ORDER BY j.n;
END
$fn$;
