-- Budgets: a restarted gateway sums each caller's spending (lifetime and today) from here.
CREATE INDEX model_calls_caller_started_at ON model_calls (caller, started_at);
