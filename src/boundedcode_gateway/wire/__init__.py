"""Wire formats: SSE framing and OpenAI chat-completions shapes (pure, no I/O)."""
