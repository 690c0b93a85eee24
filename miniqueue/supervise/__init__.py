"""The prefork supervisor: its children, the pipe protocol between them, recovery, the process
registry, probes and metrics.

Rule: Imports any layer below it; only the CLI imports it.
"""
