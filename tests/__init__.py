"""Test suite for the inference gateway."""
