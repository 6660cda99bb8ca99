"""The ``report`` subcommand's parts: rows from the call log, per-task totals, the text
renderings (Markdown, CSV, JSON) and the charts (matplotlib, imported only for them).

Reads what the gateway recorded and must not recompute it (a miss cause is shown as
logged); it never writes the call log or the ledger.
"""
