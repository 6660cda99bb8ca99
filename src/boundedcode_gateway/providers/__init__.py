"""Upstream adapters: one package per API shape, differences as data inside each."""
