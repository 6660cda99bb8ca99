"""The overhead benchmark: this gateway against the direct path, LiteLLM and Portkey."""
