"""``python -m chaos``: run the chaos harness (``--help`` for the options)."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
