"""A database router that keeps miniqueue's migrations off every database (the project's own
tables still migrate)."""

from __future__ import annotations

from typing import Any


class NoQueueMigrations:
    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if app_label == "miniqueue" else None
