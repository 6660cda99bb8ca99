"""Anthropic's Messages API: translation both ways, streaming, thinking blocks replayed."""
