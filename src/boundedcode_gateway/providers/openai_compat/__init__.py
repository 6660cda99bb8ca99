"""OpenAI-shaped upstreams: llama.cpp, other local servers, OpenAI, OpenAI-compatible clouds."""
