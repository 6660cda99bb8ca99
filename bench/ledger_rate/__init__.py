"""How fast calls are recorded, SQLite against PostgreSQL (``python -m bench.ledger_rate``)."""
