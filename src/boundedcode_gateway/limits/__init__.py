"""Rate and concurrency limits, in process: how much of a request-rate or token-rate
limit the last window used and whether a call fits (``windows.py``), and the places of
a concurrency limit with its bounded, fair queue (``in_flight.py``).

The arithmetic is pure and takes the time as an argument, so a shared store
(PostgreSQL, Redis) can apply the same rule to the same state. Nothing here does I/O
or reads a configuration.
"""
