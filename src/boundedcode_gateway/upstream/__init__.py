"""What lies under the provider adapters: the HTTP client every upstream is reached with,
what a model can do (``Capabilities``) and what one answer measured (``CallMetrics``).

``policy/``, ``llama_server/`` and ``metering/`` use these without knowing any provider.
"""
