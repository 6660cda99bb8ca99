-- What a conversation's slot file gave the call: the tokens restored into its slot,
-- the time that took, and the time spent saving the conversation that left the slot
-- (docs/llama-server.md, "Slot files").
ALTER TABLE model_calls ADD COLUMN restored_tokens INTEGER;
ALTER TABLE model_calls ADD COLUMN slot_restore_ms DOUBLE PRECISION;
ALTER TABLE model_calls ADD COLUMN slot_save_ms DOUBLE PRECISION;
