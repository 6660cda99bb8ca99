-- The page of calls lists the newest calls first, whatever their task.
CREATE INDEX model_calls_started_at ON model_calls (started_at);
