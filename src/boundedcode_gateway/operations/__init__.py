"""The operator's view of a running gateway: metrics, readiness, configuration reloads."""
