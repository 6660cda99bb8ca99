"""Who may call: caller keys, task-scoped tokens, and what each may use and spend."""
