"""How the command line reports a problem: one line and an exit status, never a traceback or
click's usage block.

Exit 2 means bad input (nothing was changed: a value that broke a rule, an app that does not
load, a wrong command line), exit 1 any other failure (database unreachable, a job in the wrong
state). Every command is wrapped in :func:`friendly_errors`; ``miniqueue`` and
``miniqueue-supervise`` are :class:`OneLineGroup` and :class:`OneLineCommand`, which cover the
usage errors of every command below them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from ..core.errors import AppLoadError, InvalidInput, MiniqueueError

F = TypeVar("F", bound=Callable[..., Any])


class BadInput(click.ClickException):
    """A value broke a rule (nothing was stored), or the command line is wrong: one line, exit 2."""

    exit_code = 2


def friendly_errors(command: F) -> F:
    """Report miniqueue errors as one line, never a traceback: exit 2 for bad input (an app that
    does not load included), else 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except InvalidInput as exc:
            raise BadInput(in_options(exc)) from exc
        except AppLoadError as exc:
            raise BadInput(str(exc)) from exc
        except MiniqueueError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def in_options(exc: InvalidInput) -> str:
    """``exc``'s message with each keyword argument it tells the caller to pass said as the
    running command's option (``create=True``: ``--create``); one the command has no option for
    stays as the message writes it."""
    message = str(exc)
    ctx = click.get_current_context(silent=True)
    options = {p.name: p for p in ctx.command.params if isinstance(p, click.Option)} if ctx else {}
    for name, value in exc.arguments.items():
        if name in options:
            message = message.replace(f"{name}={value}", _option_words(options[name], value))
    return message


def _option_words(option: click.Option, value: str) -> str:
    """How the command line passes ``value`` by ``option``: its flag (``--create``; of a pair,
    the one that sets the value, or both for any value), else the option and the value."""
    if not option.is_flag:
        return f"{option.opts[0]} {value}"
    both = "/".join([*option.opts, *option.secondary_opts])
    if value == "True":
        return option.opts[0]
    return option.secondary_opts[0] if value == "False" and option.secondary_opts else both


# Since click 8.2, a group given no command raises this to show its help: that stays as it is.
_SHOWS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


@contextlib.contextmanager
def usage_in_one_line() -> Iterator[None]:
    """Turn click's usage errors (a bad option value, a missing argument, an unknown option or
    command) into one line that names the problem and where the help is, exit 2, instead of
    click's usage block."""
    try:
        yield
    except click.UsageError as exc:
        if isinstance(exc, _SHOWS_HELP):
            raise
        message = " ".join(exc.format_message().splitlines()).rstrip(".")
        if exc.ctx is not None:
            message += f" (see '{exc.ctx.command_path} --help')"
        raise BadInput(message) from exc


class OneLineCommand(click.Command):
    """A command whose usage errors are one line (see :func:`usage_in_one_line`), including
    those of its subcommands when it is a group."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with usage_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with usage_in_one_line():
            return super().invoke(ctx)


class OneLineGroup(OneLineCommand, click.Group):
    """:class:`OneLineCommand` for a group: ``miniqueue`` itself."""
