"""The Django app that carries ``manage.py miniqueue``, and hooks miniqueue into ``migrate`` and
the test runner.

- ``migrate`` applies miniqueue's pending migrations to ``MINIQUEUE['DATABASE']`` (on
  ``pre_migrate``, before the project's own migrations, so a data migration can enqueue).
  A signal rather than a Django migration: Django records a migration once and never runs it
  again, so a migration file could not follow the queue's own numbered migrations across
  upgrades (nor run under ``--keepdb``, or with a test database's ``"MIGRATE": False``, which
  skips migration files but still sends the signal). miniqueue's migrations record what they
  applied themselves: with nothing pending, this costs ``migrate`` one short transaction. A database
  router's ``allow_migrate(db, "miniqueue")`` returning False keeps them off that database.
- A connection to no particular database, which Django opens to create or drop a test
  database, closes the pools :func:`~miniqueue.integrations.django.get_client` opened
  (:func:`~miniqueue.integrations.django.close_clients`): an idle pooled connection on the
  test database would make its ``DROP DATABASE`` fail and leave it behind.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import router
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.signals import connection_created
from django.db.models.signals import pre_migrate


class MiniqueueConfig(AppConfig):
    name = "miniqueue.integrations.django"
    label = "miniqueue"
    verbose_name = "miniqueue"

    def ready(self) -> None:
        # Django sends the migrate signals to apps that have a models module (an empty one here).
        pre_migrate.connect(_migrate_queue, sender=self, dispatch_uid="miniqueue-migrate")
        connection_created.connect(_close_before_no_db_work, dispatch_uid="miniqueue-close-clients")


def _migrate_queue(sender: AppConfig, *, using: str, verbosity: int = 1, stdout: Any = None, **kwargs: Any) -> None:
    from . import get_settings, migrate

    if using != get_settings().database or not router.allow_migrate(using, sender.label):
        return
    applied = migrate(using)
    if applied and verbosity >= 1 and stdout is not None:
        versions = f"{applied[0].version:03d}" + (f"-{applied[-1].version:03d}" if len(applied) > 1 else "")
        stdout.write(f"  Applied miniqueue's migrations {versions} to {using!r}\n")


def _close_before_no_db_work(sender: Any, *, connection: Any, **kwargs: Any) -> None:
    if connection.alias == NO_DB_ALIAS:
        from . import close_clients

        close_clients()
