"""The one access layer for PostgreSQL: connections, migrations, outages, counts."""
