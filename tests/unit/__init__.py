"""Tests that need no database: pure decisions on fabricated values, the command line's
surface, the protocol's model. They run with no PostgreSQL at all (``python -m pytest tests/unit``)."""
