"""Tracing and logs.

Rule: Imports ``core`` and ``tasks`` (the outcome vocabulary included: ``tasks.outcomes``).
"""
