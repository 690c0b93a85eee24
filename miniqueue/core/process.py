"""Process plumbing shared by the supervisor and its children: titles and log labels, signal
names, exit statuses, parent death, the cyclic collector of a long-lived child."""

from __future__ import annotations

import ctypes
import gc
import os
import re
import signal
import socket
import sys

import setproctitle

from .errors import ConfigError

#: Exit code of a child that could not boot (bad app, bad config): do not respawn blindly.
EXIT_BOOT_ERROR = 3

#: Exit code of a child that found the schema migrated past what this version of miniqueue can
#: serve (see "Rolling deploys" in docs/operations/schema.md): its supervisor stops, and never
#: forks another.
EXIT_SCHEMA_REFUSED = 4

_PR_SET_PDEATHSIG = 1

_label = "supervisor"


#: Overrides the host name in worker ids and the process registry (two containers sharing a
#: host name, or tests that play several hosts on one machine).
HOST_ENV = "MINIQUEUE_HOST"
_HOST_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")


def host_name() -> str:
    """This host's name in worker ids (``host:pid:suffix``) and in the process registry."""
    name = os.environ.get(HOST_ENV) or socket.gethostname()
    if not _HOST_RE.fullmatch(name):
        raise ConfigError(f"host name {name!r} (${HOST_ENV}) is invalid: use 1-100 characters of A-Z a-z 0-9 . _ -")
    return name


def settle_collector() -> None:
    """Before a child's long loop: leave the objects it built at start (modules, its app, its
    worker) out of every later collection of the cyclic collector (``gc.freeze``). A drain of
    no-op jobs spent 1.3 µs a job in collections that walked those 50,000 objects again and
    again. The young objects are collected as often as before: a failed job's traceback is a
    cycle, and whatever its handler held waits for a collection to be freed."""
    gc.freeze()


def set_title(text: str) -> None:
    """Name this process ``miniqueue <text>`` in ps/top (never put a DSN here)."""
    setproctitle.setproctitle(f"miniqueue {text}")


def set_label(name: str) -> None:
    """Name this process in its log lines (``worker-3``, ``reaper``, ``supervisor``)."""
    global _label
    _label = name


def label() -> str:
    """This process's name in its log lines."""
    return _label


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(status: int) -> str:
    """Turn a ``waitpid`` status into words: ``killed by SIGKILL``, ``exited with code 3``."""
    if os.WIFSIGNALED(status):
        return f"killed by {signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the parent-pid check in the child still catches an orphaned child
