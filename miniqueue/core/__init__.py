"""The vocabulary and plumbing every layer shares: errors, records, validation, limits, backoff,
connections.

Rule: Imports nothing of miniqueue outside ``core``.
"""
