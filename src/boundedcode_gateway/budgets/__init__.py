"""Budgets: what each caller and each task has spent, and the refusal of a call that would
start over its budget."""
