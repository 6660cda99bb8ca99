"""The fronts: the callers' APIs other than chat completions (Anthropic Messages, OpenAI
Responses), each translated to and from the chat shape the call path speaks."""
