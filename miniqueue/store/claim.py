"""The claim: completing a worker's batch and leasing the best available jobs, limits and caps
admitted, in one statement.

The claim is one template in ``claim.sql`` beside this module, with the comments that explain its
parts, and the named clauses composed into it. Two switches stay in its text because each
changes a query plan (one queue or several; stepping up or down through the groups of limited
jobs), so the store prepares four variants of it; every other difference is a parameter. A claim
with nothing to complete sends empty arrays.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.db import Connection
from ..core.errors import InvalidInput
from ..core.records import Lease
from .base import Statement, StoreBase, compose
from .finishing import COMPLETION
from .rows import aligned, bigints, columns

#: The most groups of limited jobs (jobs naming the same limits) one claim takes into admission:
#: as many as the largest prefetch buffer ``auto`` holds. Since a claim keeps the groups of the
#: jobs it completes (see `kept` in claim.sql), on 2 cores a drain of 50,000 jobs over 5,000 keys
#: ran 7-12% faster taking 1,000 groups per claim than taking 500 (medians of 3 and of 5 runs).
MAX_GROUPS_PER_CLAIM = 1000


def groups_needed(limit: int, together: int, per_group: int) -> int:
    """The groups of limited jobs a claim of ``limit`` jobs looks for: one a job, or, where up
    to ``together`` jobs of a group come together, one for each ``per_group`` jobs (how many a
    group gave the caller's last claim)."""
    return -(-min(limit, MAX_GROUPS_PER_CLAIM) // max(1, min(per_group, together)))


# A claimed row's turn and id, and its priority (see complete_and_claim).
_TURN_AND_ID = operator.itemgetter(-1, 2)
_PRIORITY = operator.itemgetter(6)


def load_statements(text: str) -> dict[str, str]:
    """The statements of a file like ``claim.sql``, by name: each starts at a ``-- name: <name>``
    line and its comment lines, and is the text up to the next one (trailing empty lines left
    out), between a newline before and after, as the store writes every multi-line statement."""
    statements = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, rest = block.partition("\n")
        lines = rest.split("\n")
        while lines and lines[0].startswith("--"):
            del lines[0]
        while lines and not lines[-1]:
            del lines[-1]
        statements[name] = "\n" + "\n".join(lines) + "\n"
    return statements


_PARTS = load_statements(Path(__file__).with_name("claim.sql").read_text(encoding="utf-8"))
#: The clauses the template uses in each variant, as claim.sql's header describes them.
_SHARED = {name: _PARTS[name].strip("\n") for name in ("room", "has_room", "held", "refilled")}
_QUEUES = {"one": _PARTS["fast_one"].strip("\n"), "many": _PARTS["fast_many"].strip("\n")}
_QUEUE_NAMES = {"one": _PARTS["queue_names_one"].strip("\n"), "many": _PARTS["queue_names_many"].strip("\n")}
_DIRECTIONS = {"up": {"next": ">", "order": ""}, "down": {"next": "<", "order": " DESC"}}


def _claim(queues: str, direction: str) -> Statement:
    """The variant of the claim from ``queues`` ("one" or "many"), stepping ``direction``."""
    room, has_room = (
        compose(_SHARED[name], held=_SHARED["held"], refilled=_SHARED["refilled"]) for name in ("room", "has_room")
    )
    return Statement(
        compose(
            _PARTS["claim"],
            completion=COMPLETION,
            fast=_QUEUES[queues],
            queue_names=_QUEUE_NAMES[queues],
            room=room,
            has_room=has_room,
            held=_SHARED["held"],
            refilled=_SHARED["refilled"],
            **_DIRECTIONS[direction],
        )
    )


class Claiming(StoreBase):
    """Leasing jobs."""

    _claim_one = _claim("one", "up")
    _claim_many = _claim("many", "up")
    _claim_one_down = _claim("one", "down")
    _claim_many_down = _claim("many", "down")

    def claim(
        self,
        conn: Connection,
        queues: Sequence[str],
        worker_id: str,
        lease_duration: float,
        limit: int,
        *,
        after: Sequence[str] = (),
        descending: bool = False,
        tasks: Sequence[str] | None = None,
        together: int = 1,
        per_group: int = 1,
    ) -> list[Lease]:
        """Lease up to ``limit`` available jobs from ``queues``, best first.

        Order: priority (higher first), then scheduled time, then id. Jobs scheduled in the
        future are invisible. Each claimed job is ``running``, leased to ``worker_id`` until
        ``now() + lease_duration``, its ``attempt`` one higher.

        Jobs with limits are claimed only where every limit they name has room, and a queue
        with a cap gives no more jobs than its free slots. Limited jobs are taken group by
        group (jobs naming the same limits form a group), priority first within a group; a
        claim looks at the groups after ``after`` (the limits of the last limited job the
        caller claimed, so that successive claims go round every group): in the order of their
        limits, or ``descending`` (from the last group when ``after`` is empty). Given
        ``tasks``, only jobs of those tasks are claimed (a worker's: its app's tasks).

        Of a group whose one limit is a free limit of 1, up to ``together`` jobs are taken
        *together*: the caller must run them one after another, never
        two at once (their leases are flagged ``together``). ``per_group`` is how many jobs the
        caller expects a group to give (its last claim's), so that the claim locks the limits of
        about as many groups as it needs, not one group per job.
        """
        if not queues or limit < 1:
            return []
        return self.complete_and_claim(
            conn,
            worker_id,
            (),
            queues,
            lease_duration,
            limit,
            after=after,
            descending=descending,
            tasks=tasks,
            together=together,
            per_group=per_group,
        )[1]

    def complete_and_claim(
        self,
        conn: Connection,
        worker_id: str,
        completions: Iterable[tuple[int, int]],
        queues: Sequence[str],
        lease_duration: float,
        limit: int,
        *,
        after: Sequence[str] = (),
        descending: bool = False,
        results: Mapping[int, str] | None = None,
        tasks: Sequence[str] | None = None,
        together: int = 1,
        per_group: int = 1,
        keep: Iterable[int] | None = None,
    ) -> tuple[set[int], list[Lease]]:
        """:meth:`complete_many` and :meth:`claim` in one statement (one round trip, one commit):
        the claim (with nothing to complete, :meth:`claim` sends it with empty arrays).

        The groups of the limited jobs it completes are looked at before the others (their next
        jobs, as far as their limits allow, go to the same worker), and do not move along the
        groups after ``after``: see docs/guides/limits.md. ``keep`` names the completed jobs whose
        groups are looked at so (None: every one); the caller leaves out a job whose claim took
        every job of its group it found.
        Returns the ids completed (those whose lease was still held) and the new leases.
        """
        ids, attempts = columns(completions)
        kept = ids if keep is None else bigints(keep)
        query, params = self._claim_query(
            queues,
            worker_id,
            lease_duration,
            max(limit, 0),
            after=after,
            descending=descending,
            tasks=tasks,
            together=together,
            per_group=per_group,
        )
        rows = self._rows(
            conn, query, {**params, "ids": ids, "attempts": attempts, "results": aligned(ids, results), "keep": kept}
        )
        completed = set(rows[0][0] or ()) if rows else set()
        together_ids = set(rows[0][1] or ()) if rows else set()
        # Each row: the ids completed and those taken together (first row only), the lease, and
        # its turn (see claim.sql). Best first: by turn and id, then (a stable sort) by priority,
        # highest first.
        claimed = sorted((row for row in rows if row[2] is not None), key=_TURN_AND_ID)
        claimed.sort(key=_PRIORITY, reverse=True)
        if not together_ids:
            return completed, [Lease(*row[2:-1]) for row in claimed]
        return completed, [Lease._make((*row[2:-1], row[2] in together_ids)) for row in claimed]

    def _claim_query(
        self,
        queues: Sequence[str],
        worker_id: str,
        lease_duration: float,
        limit: int,
        *,
        after: Sequence[str],
        descending: bool,
        tasks: Sequence[str] | None = None,
        together: int = 1,
        per_group: int = 1,
    ) -> tuple[str, dict[str, Any]]:
        queues = list(dict.fromkeys(queues))  # a queue named twice would claim its rows twice over
        if not queues:
            raise InvalidInput("claim needs at least one queue")
        # Going down, the first group is the last: an array with a NULL sorts after every other.
        start: list[str | None] = [*after] or ([None] if descending else [])
        needed = groups_needed(limit, together, per_group)
        params: dict[str, Any] = {
            "worker": worker_id,
            "lease_duration": float(lease_duration),
            "limit": limit,
            "after": start,
            # Groups taken into admission: those needed, and a few more (as many again, 16 at
            # most) for groups that give fewer jobs than hoped (each of those gives one job at
            # most: see claim.sql); and groups seen at most per queue, those passed over (full,
            # or locked by another claim) included. The groups of the jobs being completed take
            # at most those needed: the sweep keeps the rest.
            "groups": needed + min(needed, 16),
            "scan": 4 * (min(limit, MAX_GROUPS_PER_CLAIM) + 16),
            "needed": needed,
            "tasks": None if tasks is None else list(tasks),
            "together": max(1, together),
            # Whether two groups of the claim may share a scope: one key's jobs in two queues.
            "shared": len(queues) > 1,
        }
        if len(queues) == 1:
            params["queue"] = queues[0]
            return (self._claim_one_down if descending else self._claim_one), params
        params["queues"] = queues
        return (self._claim_many_down if descending else self._claim_many), params
