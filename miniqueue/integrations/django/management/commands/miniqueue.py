"""``manage.py miniqueue COMMAND ...``: miniqueue's command line against Django's database.

Every ``miniqueue`` command works (``migrate``, ``supervise``, ``stats``, ``jobs``...), with
``DATABASE_URL`` and ``MINIQUEUE_SCHEMA`` taken from Django's settings (see
:mod:`miniqueue.integrations.django`), and ``supervise --app`` from ``MINIQUEUE['APP']``. The
supervisor's workers are forked from this process, after Django is set up, so handlers can use
the ORM; Django's connections are closed first, since none may cross a fork.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from miniqueue.integrations.django import database_url, get_settings


class Command(BaseCommand):
    help = "Run a miniqueue command against Django's database: migrate, supervise, stats, jobs... (--help)"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="miniqueue's command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        # miniqueue's options (--help among them) are click's to parse, not argparse's.
        code = run_cli(argv[2:], prog_name=f"{os.path.basename(argv[0])} {argv[1]}")
        raise SystemExit(code)

    def handle(self, *args: Any, **options: Any) -> None:
        arguments = [str(a) for a in options.get("arguments") or ()]
        code = run_cli(arguments, prog_name="manage.py miniqueue")
        if code:
            raise CommandError(f"miniqueue {' '.join(arguments[:1])} exited with status {code}", returncode=code)


def run_cli(arguments: list[str], *, prog_name: str) -> int:
    """Run miniqueue's command line with Django's database; return its exit status."""
    from miniqueue.cli.main import main

    chosen = get_settings()
    if arguments[:1] == ["supervise"] and chosen.app and not any(a.split("=")[0] == "--app" for a in arguments):
        arguments = ["supervise", "--app", chosen.app, *arguments[1:]]
    connections.close_all()
    with _environment(DATABASE_URL=database_url(), MINIQUEUE_SCHEMA=chosen.schema):
        try:
            main.main(args=arguments, prog_name=prog_name, standalone_mode=True)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block (the DSN travels there, not in argv, where
    ``ps`` would show its password)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
