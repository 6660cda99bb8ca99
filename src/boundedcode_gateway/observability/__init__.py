"""Calls seen where operators already look: OpenTelemetry traces and metrics over OTLP,
made from each call's record off the request path (docs/observability.md)."""
