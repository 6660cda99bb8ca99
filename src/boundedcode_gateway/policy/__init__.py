"""Pure decisions the pipeline applies: no I/O, no provider wire formats."""
