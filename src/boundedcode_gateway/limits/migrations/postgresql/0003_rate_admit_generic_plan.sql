-- rate_admit's statements keep one plan per connection (a generic plan): planned afresh
-- for each call's values, as PL/pgSQL does by default, the planning took a quarter of
-- the function's time, and no plan depends on the values (every row is found by its
-- key).
ALTER FUNCTION rate_admit(
    TEXT[], TEXT[], TEXT[], BIGINT[], DOUBLE PRECISION[], BIGINT[]
) SET plan_cache_mode = force_generic_plan;
