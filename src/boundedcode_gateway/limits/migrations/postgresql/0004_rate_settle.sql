-- What calls spent, settled in the windows they started in in one statement
-- (limits/shared.py), instead of a transaction of four round trips (its start, the rows
-- locked and read, the write, the commit).

-- windows.settle for one window, to the bit (the same float8 operations as
-- rate_window_admit's roll, then the window the call was counted in found by the same
-- rounding): `difference` (what the call spent less what it was admitted on) goes to the
-- window that began at `counted_in`, the current or the previous one; a window two or
-- more behind is in no estimate any more and is left as it is. No count goes below 0.
CREATE FUNCTION rate_window_settle(
    start DOUBLE PRECISION, current BIGINT, previous BIGINT, window_s DOUBLE PRECISION,
    now_s DOUBLE PRECISION, difference BIGINT, counted_in DOUBLE PRECISION,
    OUT settled_start DOUBLE PRECISION, OUT settled_current BIGINT,
    OUT settled_previous BIGINT
) LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    window_now DOUBLE PRECISION := floor(now_s / window_s);
    steps DOUBLE PRECISION := window_now - round(start / window_s);
    behind DOUBLE PRECISION;
BEGIN
    settled_start := start;
    settled_current := current;
    settled_previous := previous;
    IF steps > 0 THEN
        settled_start := window_now * window_s;
        settled_current := 0;
        settled_previous := CASE WHEN steps = 1 THEN current ELSE 0 END;
    END IF;
    behind := round(settled_start / window_s) - round(counted_in / window_s);
    IF behind = 0 THEN
        settled_current := greatest(settled_current + difference, 0);
    ELSIF behind = 1 THEN
        settled_previous := greatest(settled_previous + difference, 0);
    END IF;
END
$fn$;

-- One call's settlements: window kinds[i]/names[i]/metrics[i] (distinct) of windows_s[i]
-- seconds, differences[i] more than it was admitted on, in the window that began at
-- counted_ins[i]. The rows are locked in rate_admit's order, so a settlement and an
-- admission never wait on each other; a row swept since is not made again.
CREATE FUNCTION rate_settle(
    kinds TEXT[], names TEXT[], metrics TEXT[], windows_s DOUBLE PRECISION[],
    differences BIGINT[], counted_ins DOUBLE PRECISION[]
) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $fn$
DECLARE
    settled_at DOUBLE PRECISION := extract(epoch FROM now())::DOUBLE PRECISION;
BEGIN
    PERFORM 1
    FROM unnest(kinds, names, metrics) AS k(kind, name, metric)
    JOIN rate_windows w ON w.kind = k.kind AND w.name = k.name AND w.metric = k.metric
    ORDER BY k.kind COLLATE "C", k.name COLLATE "C", k.metric COLLATE "C"
    FOR UPDATE OF w;
    UPDATE rate_windows AS w
    SET (start, current, previous, touched_at) = (
        SELECT s.settled_start, s.settled_current, s.settled_previous, now()
        FROM rate_window_settle(
            w.start, w.current, w.previous, k.win, settled_at, k.difference, k.counted_in
        ) s
    )
    FROM unnest(kinds, names, metrics, windows_s, differences, counted_ins)
        AS k(kind, name, metric, win, difference, counted_in)
    WHERE w.kind = k.kind AND w.name = k.name AND w.metric = k.metric;
END
$fn$;
