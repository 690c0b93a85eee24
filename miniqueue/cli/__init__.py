"""The ``miniqueue`` and ``miniqueue-supervise`` commands.

Rule: May import every layer.
"""

from .main import main, supervise_main

__all__ = ["main", "supervise_main"]
