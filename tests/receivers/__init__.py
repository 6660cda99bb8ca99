"""Real telemetry receivers the tests run as programs of their own (`make receivers`)."""
