"""Reasoning kept on the host: per-task stores, keyed by a turn's tool-call ids or its text."""
