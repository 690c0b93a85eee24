"""What the log of ``miniqueue-supervise --shards`` says about a run over several databases:
which supervisor serves which database, each one the process above them started again, each
worker or reaper that exited before the graceful stop, and how the workers retried while their
database was down.

The process above (``[supervisor P]``) names the supervisor it starts for each database
(``started the supervisor of database db0 (pid Q, 2 workers)``), each of those names the children
it spawns, and every line carries its process's pid: so each line can be put down to its database.
A message may run over several lines (a connection error's text); the lines that do not start
with a stamp continue the one before.
"""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .faults import Fault
from .rows import Row, info, rule

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[(\S+) (\d+)\] \w+ ([\w.]+): (.*)$", re.DOTALL)
_STARTED = re.compile(r"started the supervisor of database (\S+) \(pid (\d+),")
_RESTARTED = re.compile(r"the supervisor of database (\S+) \(pid (\d+)\) exited with (-?\d+)")
_SPAWNED = re.compile(r"spawned (worker-\d+|reaper) \(pid (\d+)\)")
_CHILD_EXIT = re.compile(r"(worker-\d+|reaper) \(pid (\d+)\) (exited with code -?\d+|killed by \w+)")
_RETRY = re.compile(r"database unavailable.*; retrying in ([\d.]+)s$", re.DOTALL)
#: A retry that comes sooner than this share of the delay its line announced is early. A few are
#: fine (a handler's outcome wakes the claim loop); more are a loop that does not wait.
EARLY = 0.5
EARLY_ALLOWED = 5
#: A supervisor started again this soon after the server was up may still have found it down.
GRACE = 2.0


@dataclass(frozen=True)
class Exit:
    """A process that exited: its database, pid, when (this host's clock) and how."""

    database: str
    pid: int
    at: float
    how: str


@dataclass
class SupervisorLog:
    """The log, read per database."""

    #: Every supervisor, worker and reaper pid -> its database.
    owner: dict[int, str] = field(default_factory=dict)
    #: Each database's supervisors, in the order they were started.
    started: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    #: A database's supervisor that exited (the process above starts it again).
    supervisor_exits: list[Exit] = field(default_factory=list)
    #: A worker or reaper that exited while its supervisor was not stopping.
    child_exits: list[Exit] = field(default_factory=list)
    #: Per worker pid: its claim loop's retries while its database did not answer, as (when,
    #: the delay announced: ``retrying in 0.4s``).
    retries: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    #: Per worker pid: its heartbeats that failed.
    heartbeat_failures: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    @classmethod
    def parse(cls, logs: str) -> SupervisorLog:
        found = cls()
        entries = _entries(logs)
        # First who serves which database: a child may log before its parent's line about it.
        for _, _, _, _, message in entries:
            if started := _STARTED.search(message):
                found.owner[int(started[2])] = started[1]
                found.started[started[1]].append(int(started[2]))
        stopping: set[int] = set()
        for at, role, pid, logger, message in entries:
            found._read(at, role, pid, logger, message, stopping)
        return found

    def _read(self, at: float, role: str, pid: int, logger: str, message: str, stopping: set[int]) -> None:
        database = self.owner.get(pid, "?")
        if restarted := _RESTARTED.search(message):
            self.supervisor_exits.append(Exit(restarted[1], int(restarted[2]), at, f"exited with {restarted[3]}"))
        elif role == "supervisor" and message == "received SIGTERM":
            stopping.add(pid)
        elif role == "supervisor" and (spawned := _SPAWNED.search(message)):
            self.owner[int(spawned[2])] = database
        elif role == "supervisor" and pid not in stopping and (child := _CHILD_EXIT.search(message)):
            self.child_exits.append(Exit(database, int(child[2]), at, f"{child[1]} {child[3]}"))
        elif logger == "miniqueue.worker" and (retry := _RETRY.search(message)):
            self.retries[pid].append((at, float(retry[1])))
        elif logger == "miniqueue.heartbeat" and message.startswith("heartbeat failed"):
            self.heartbeat_failures[pid] += 1

    def current(self, database: str) -> int | None:
        """The pid of ``database``'s latest supervisor."""
        pids = self.started.get(database)
        return pids[-1] if pids else None


def _entries(logs: str) -> list[tuple[float, str, int, str, str]]:
    """Each log message as (epoch seconds, role, pid, logger, message), continuation lines joined."""
    lines: list[str] = []
    for line in logs.splitlines():
        if _LINE.match(line) or not lines:
            lines.append(line)
        else:
            lines[-1] += "\n" + line
    entries = []
    for line in lines:
        if match := _LINE.match(line):
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # this host's local time
            entries.append((at, match[2], int(match[3]), match[4], match[5]))
    return entries


def supervisor_rows(log: SupervisorLog, stopped: str, up: float, kill: Fault | None, data: dict[str, Any]) -> list[Row]:
    """The database supervisors kept running (or, the one the harness killed, came back), their
    workers kept running, and the workers of ``stopped`` (its server up again at ``up``) backed
    off while it was down."""
    killed = set(kill.pids) if kill else set()
    refused, unexpected = _supervisor_exits(log, stopped, up, kill)
    children = [e for e in log.child_exits if e.pid not in killed]
    workers = [pid for pid, database in log.owner.items() if database == stopped and pid in log.retries]
    delays = [delay for pid in workers for _, delay in log.retries[pid]]
    hasty = [h for pid, retries in sorted(log.retries.items()) if (h := _hasty(pid, retries))]
    beats = sum(n for pid, n in log.heartbeat_failures.items() if log.owner.get(pid) == stopped)
    data["supervisors"] = {
        "started": {database: pids for database, pids in log.started.items()},
        "exits": [vars(e) for e in log.supervisor_exits],
        "refused_while_down": len(refused),
        "child_exits": [vars(e) for e in children],
        "stopped_workers_retries": {pid: len(log.retries[pid]) for pid in workers},
        "early_retries": hasty,
        "stopped_workers_heartbeat_failures": beats,
    }
    return [
        info("database supervisors started (one each, and again after an exit)", _started(log)),
        rule("  a database's supervisor exited, not killed by the harness", [_describe(e) for e in unexpected]),
        info("  started again while its server was down, and refused to start", len(refused)),
        rule("  workers and reapers that exited before the graceful stop", [_describe(e) for e in children]),
        info(
            f"  {stopped}'s workers while it was down: claim-loop retries",
            f"{len(delays)} (back-off {min(delays):g}s to {max(delays):g}s)" if delays else "0",
        ),
        rule(
            f"  workers retrying sooner than their back-off (over {EARLY_ALLOWED} times)",
            hasty,
        ),
        info(f"  {stopped}'s workers while it was down: heartbeats that failed", beats),
    ]


def _supervisor_exits(log: SupervisorLog, stopped: str, up: float, kill: Fault | None) -> tuple[list[Exit], list[Exit]]:
    """The database supervisors' exits: those started again while ``stopped``'s server was down
    after the harness killed its supervisor, which refuse to start (they check their database
    first: by design, reported), and the others, which no fault explains."""
    killed = set(kill.pids) if kill else set()
    refused = [
        e
        for e in log.supervisor_exits
        if kill and e.database == stopped and e.pid not in killed and kill.at <= e.at <= up + GRACE
    ]
    return refused, [e for e in log.supervisor_exits if e.pid not in killed and e not in refused]


def _hasty(pid: int, retries: list[tuple[float, float]]) -> str:
    """What is wrong with a worker's retries if more than EARLY_ALLOWED came sooner than EARLY
    times the delay the one before announced; else ``""``."""
    early = [(at, delay) for (at, delay), (then, _) in itertools.pairwise(retries) if then - at < EARLY * delay]
    if len(early) <= EARLY_ALLOWED:
        return ""
    span = retries[-1][0] - retries[0][0]
    return (
        f"pid {pid}: {len(early)} of {len(retries)} retries came sooner than {EARLY:g}x the delay announced "
        f"(e.g. 'retrying in {early[-1][1]:g}s'), {len(retries)} in {span:.1f}s"
    )


def _started(log: SupervisorLog) -> str:
    return ", ".join(f"{database} {len(pids)}" for database, pids in sorted(log.started.items())) or "-"


def _describe(e: Exit) -> str:
    return f"{e.database}: pid {e.pid} {e.how} at {datetime.fromtimestamp(e.at).strftime('%H:%M:%S.%f')[:-3]}"
