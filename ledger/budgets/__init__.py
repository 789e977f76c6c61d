"""Budgets: the rolling-hour and 24 h windows, source caps and scope limits (pure checks)."""
