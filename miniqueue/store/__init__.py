"""The only code that runs SQL: the statements and the migrations.

Rule: Imports ``core`` only; never the worker, the client or the supervisor.
"""
