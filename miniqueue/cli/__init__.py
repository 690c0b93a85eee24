"""The ``miniqueue`` and ``miniqueue-supervise`` commands.

Rule: May import every layer; reaches the database through the client alone (of the store,
only the migrator).

``main`` assembles the ``miniqueue`` group from the commands of ``jobs``, ``queues``,
``periodic``, ``admin`` and ``serve``; these share ``errors`` (one-line errors and exit
statuses), ``database`` (``--database-url``/``--schema`` and the client on them), ``params``
(the kinds of value options take) and ``output`` (``--json``). ``demo`` is the app ``miniqueue
demo`` runs. ``tests/unit/test_cli_surface.py`` pins every command's help and options.
"""

from .main import main, supervise_main

__all__ = ["main", "supervise_main"]
