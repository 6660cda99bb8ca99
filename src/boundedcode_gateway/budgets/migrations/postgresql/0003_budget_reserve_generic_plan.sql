-- budget_reserve's statements keep one plan per connection (a generic plan): planned
-- afresh for each call's values, as PL/pgSQL does by default, the planning took about
-- half of the function's time, and no plan depends on the values (every row is found by
-- its key).
ALTER FUNCTION budget_reserve(
    TEXT, TEXT, DOUBLE PRECISION, TEXT, BIGINT[], TEXT[], TEXT[], BOOLEAN[],
    DOUBLE PRECISION[], BIGINT[], BIGINT[], DOUBLE PRECISION, BIGINT, BIGINT, BOOLEAN
) SET plan_cache_mode = force_generic_plan;
