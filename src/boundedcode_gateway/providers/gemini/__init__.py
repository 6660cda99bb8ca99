"""The Gemini upstream: OpenAI chat-completions to ``generateContent`` and back."""
