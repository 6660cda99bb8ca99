"""The HTTP front: parse, validate, route, render. Bad input becomes an OpenAI-shaped 4xx here."""
