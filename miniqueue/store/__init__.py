"""The only code that runs SQL: the statements (:class:`Store`, one module per concern beside
it) and the migrations.

Rule: Imports ``core`` only; never the worker, the client or the supervisor.
"""

from .store import Store

__all__ = ["Store"]
