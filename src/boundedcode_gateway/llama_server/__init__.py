"""The managed llama.cpp server: profile keys to flags, binary and model, the process."""
