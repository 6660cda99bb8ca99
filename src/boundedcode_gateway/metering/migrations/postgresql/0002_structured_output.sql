-- Structured output: what happened to the schema a call sent, and whether the reply matched it.
ALTER TABLE model_calls ADD COLUMN structured_output TEXT;
ALTER TABLE model_calls ADD COLUMN schema_valid BOOLEAN;
