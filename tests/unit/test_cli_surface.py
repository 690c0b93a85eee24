"""What the command line shows its users, pinned: every command's ``--help`` and its parameters.

The expected text lives in ``tests/cli_surface/``: ``help.txt`` (the ``--help`` of ``miniqueue``,
every command and subcommand, and ``miniqueue-supervise``, as an 80-column terminal shows them) and ``commands.json``
(click's description of every command: names, options, types, defaults, environment variables,
context settings, classes). A change to the CLI's code that should not change what users see (a module
split, a renamed helper) must leave both as they are; a change meant to be seen regenerates them
with ``python -m tests.unit.test_cli_surface`` and shows up in the diff for review.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from miniqueue.cli import main

EXPECTED = Path(__file__).parents[1] / "cli_surface"

#: ``miniqueue-supervise`` is ``miniqueue supervise`` under a name of its own.
supervise = main.commands["supervise"]


def command_paths(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The words that name every command below ``group`` (``("jobs", "list")``...), depth first."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from command_paths(command, (*path, name))


def help_text(command: click.Command, prog_name: str, path: tuple[str, ...]) -> str:
    """``<prog_name> <path> --help`` as printed in a terminal of 80 columns (click wraps at 78;
    its CliRunner would wrap at 80 unless told)."""
    result = CliRunner().invoke(command, [*path, "--help"], prog_name=prog_name, terminal_width=78)
    assert result.exit_code == 0, result.output
    return result.stdout


def all_help() -> str:
    """Every help text, each under a line naming the command it belongs to."""
    sections: list[tuple[str, click.Command, tuple[str, ...]]] = [("miniqueue", main, ())]
    sections += [("miniqueue", main, path) for path in command_paths(main)]
    sections.append(("miniqueue-supervise", supervise, ()))
    return "".join(
        f"==== {' '.join((prog, *path, '--help'))}\n{help_text(command, prog, path)}"
        for prog, command, path in sections
    )


def describe(command: click.Command, ctx: click.Context) -> dict[str, Any]:
    """click's description of ``command`` (and its subcommands), with its context settings."""
    info: dict[str, Any] = command.to_info_dict(ctx)
    info["context_settings"] = command.context_settings
    info["class"] = type(command).__name__
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None
            info["commands"][name] = describe(sub, click.Context(sub, info_name=name, parent=ctx))
    return info


def all_commands() -> str:
    """Every command's description, as stable JSON text."""
    described = describe(main, click.Context(main, info_name="miniqueue"))
    return json.dumps(described, indent=1, sort_keys=True, default=repr) + "\n"


def test_every_help_text_is_unchanged() -> None:
    assert all_help() == (EXPECTED / "help.txt").read_text()


def test_every_command_and_option_is_unchanged() -> None:
    assert json.loads(all_commands()) == json.loads((EXPECTED / "commands.json").read_text())


def test_python_m_runs_the_same_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "miniqueue.cli", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        check=True,
    )
    expected = help_text(main, "miniqueue", ())
    assert done.stdout.split("\n", 1)[1] == expected.split("\n", 1)[1]
    assert done.stdout.startswith("Usage: python -m miniqueue.cli [OPTIONS] COMMAND [ARGS]...")


if __name__ == "__main__":
    EXPECTED.mkdir(exist_ok=True)
    (EXPECTED / "help.txt").write_text(all_help())
    (EXPECTED / "commands.json").write_text(all_commands())
    print(f"wrote {EXPECTED}/help.txt and commands.json")
