"""Fake upstreams (llama-server, OpenAI) served as raw ASGI apps on 127.0.0.1 for tests."""
