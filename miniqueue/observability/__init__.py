"""Tracing and logs.

Rule: Imports ``core``, ``tasks`` and the worker's outcome vocabulary.
"""
