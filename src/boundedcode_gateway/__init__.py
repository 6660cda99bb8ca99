"""BoundedCode inference gateway: OpenAI chat-completions in, every provider out, all metered."""

__version__ = "0.1.0"
