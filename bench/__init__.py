"""Benchmarks of the gateway (not shipped with the package)."""
