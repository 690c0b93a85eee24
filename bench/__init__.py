"""miniqueue's benchmark harness: ``python -m bench`` prints one table and writes JSON.

Every benchmark is a small function registered in a list (see :mod:`bench.registry`); each run
of it gets a fresh database, created, migrated and dropped by the harness. Benchmarks are
measurements, never tests: nothing here passes or fails on a figure.
"""
