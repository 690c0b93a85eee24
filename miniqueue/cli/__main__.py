"""``python -m miniqueue.cli``: the ``miniqueue`` command."""

from .main import main

main()
