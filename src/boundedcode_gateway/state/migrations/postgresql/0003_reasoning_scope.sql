-- Each answer's reasoning belongs to the scope of the caller that kept it
-- (access/caller.py: `key:<name>`, `tokens` for a task's tokens, `task` for everyone on the
-- task): a call finds and replaces only its own scope's rows. Rows kept before are given
-- `task`: who kept them is not known, so only calls that share the whole task find them.
ALTER TABLE state_reasoning ADD COLUMN scope TEXT NOT NULL DEFAULT 'task';
ALTER TABLE state_reasoning ALTER COLUMN scope DROP DEFAULT;
