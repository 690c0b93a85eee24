"""``client.schedules``: periodic schedules created, changed and deleted at run time.

A runtime schedule is validated exactly as a schedule of the code (:class:`Periodic`), lives in
the database it was created in, and is scheduled by every reaper of that database beside the
code's: each slot enqueued once fleet-wide by the same claim (see docs/guides/periodic.md,
"Schedules at run time"). Its name shares one namespace with the code's schedules: a name a
scheduler has run (or an operator switched) for the code is refused at create; a code schedule
deployed later under a runtime schedule's name wins, and the reaper logs that it skips the other.

Each operation is written once as steps, which :class:`Schedules` (sync) and
:class:`AsyncSchedules` run on their client's connections.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from ..core.errors import ConfigError, InvalidInput
from ..core.records import Schedule
from ..core.steps import Steps, atomic
from ..core.validation import check_schedule_name, check_task_name
from ..store.store import Store
from ..tasks.periodic import CatchUp, Periodic, as_periodic

if TYPE_CHECKING:
    from ..core.db import AsyncConnection, Connection

T = TypeVar("T")


class SyncRunner(Protocol):
    """What :class:`Schedules` needs of a :class:`~miniqueue.Client` (named by this protocol, not
    imported: the client holds its schedules)."""

    store: Store

    def _run(self, steps: Steps[T], conn: Connection | None = None) -> T: ...


class AsyncRunner(Protocol):
    """What :class:`AsyncSchedules` needs of an :class:`~miniqueue.AsyncClient`."""

    store: Store

    async def _run(self, steps: Steps[T], conn: AsyncConnection | None = None) -> T: ...


class _Unchanged:
    """The value of an option :meth:`Schedules.change` leaves as it is."""

    def __repr__(self) -> str:
        return "UNCHANGED"


#: Passed as ``payload`` to ``change``: keep the stored payload (None is a payload of its own).
UNCHANGED: Any = _Unchanged()


def checked(name: str, cron: str, task: str, payload: Any, timezone: str, catch_up: str, grace: float) -> Periodic:
    """The schedule these options make, validated as a schedule of the code is; a rule broken
    is an InvalidInput (a caller's value, not the app's configuration)."""
    check_schedule_name(name)
    check_task_name(task)
    mode, seconds = _catch_up(catch_up), _seconds(name, grace)
    try:
        return Periodic(name, cron, task, payload, mode, seconds, timezone)
    except ConfigError as exc:
        raise InvalidInput(str(exc)) from None


def _seconds(name: str, grace: object) -> float:
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise InvalidInput(f"grace {grace!r} of schedule {name!r} is invalid: use seconds >= 0")
    return float(grace)


def _catch_up(value: str) -> CatchUp:
    if value == "latest":
        return "latest"
    if value == "skip":
        return "skip"
    raise InvalidInput(f"catch_up {value!r} is invalid: use 'latest' or 'skip'")


class ListedSchedule(NamedTuple):
    """A periodic schedule as :meth:`Schedules.overview` lists it."""

    name: str
    #: What it enqueues, and when: the code's definition, or the stored one of a schedule made at
    #: run time; None for a schedule of the code whose definition was not given.
    schedule: Periodic | None
    #: Made at run time (``client.schedules``), not by an app's code.
    runtime: bool
    enabled: bool
    #: The last slot a scheduler enqueued (None: none yet).
    last_slot: dt.datetime | None


def listed(
    code: Mapping[str, Periodic], state: Mapping[str, tuple[dt.datetime, bool]], stored: Iterable[Schedule]
) -> list[ListedSchedule]:
    """The schedules of ``code`` by name, then the others the database holds by name (those of
    ``state``, which a scheduler has run or an operator switched, and those ``stored`` at run
    time), each with its state. A name the code uses is the code's schedule: the reapers skip a
    runtime one of that name."""
    runtime = {row.name: as_periodic(row) for row in stored if row.name not in code}
    names = sorted(code) + sorted((state.keys() | runtime.keys()) - code.keys())
    found = []
    for name in names:
        last, enabled = state.get(name, (None, True))
        found.append(ListedSchedule(name, code.get(name) or runtime.get(name), name in runtime, enabled, last))
    return found


class ScheduleSteps:
    """Each operation on runtime schedules as steps: input checked at once, then the statements."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, schedule: Periodic, enabled: bool) -> Steps[Schedule]:
        return atomic(self._create_in_one(schedule, enabled))

    def _create_in_one(self, p: Periodic, enabled: bool) -> Steps[Schedule]:
        if not (yield from self.store.create_schedule_steps(dataclasses.asdict(p), enabled)):
            existing = yield from self.store.stored_schedule_steps(p.name)
            raise InvalidInput(_taken(p.name, existing is not None))
        return (yield from self._get_known(p.name))

    def overview(self, code: Mapping[str, Periodic]) -> Steps[list[ListedSchedule]]:
        state = yield from self.store.periodic_state_steps()
        stored = yield from self.store.stored_schedules_steps()
        return listed(code, state, stored)

    def list(self) -> Steps[list[Schedule]]:
        return self.store.stored_schedules_steps()

    def get(self, name: str) -> Steps[Schedule | None]:
        return self.store.stored_schedule_steps(check_schedule_name(name))

    def change(
        self, name: str, cron: str | None, payload: Any, timezone: str | None, enabled: bool | None
    ) -> Steps[Schedule]:
        check_schedule_name(name)
        if cron is None and payload is UNCHANGED and timezone is None and enabled is None:
            raise InvalidInput(
                f"nothing to change in schedule {name!r}: pass cron=..., payload=..., timezone=... or enabled=...",
                arguments=dict.fromkeys(("cron", "payload", "timezone", "enabled"), "..."),
            )
        return atomic(self._change_in_one(name, cron, payload, timezone, enabled))

    def _change_in_one(
        self, name: str, cron: str | None, payload: Any, timezone: str | None, enabled: bool | None
    ) -> Steps[Schedule]:
        stored = yield from self.store.lock_schedule_steps(name)
        if stored is None:
            raise InvalidInput(_unknown(name))
        if (cron, payload, timezone) != (None, UNCHANGED, None):
            new = stored | {k: v for k, v in (("cron", cron), ("timezone", timezone)) if v is not None}
            new["payload"] = stored["payload"] if payload is UNCHANGED else payload
            p = checked(name, **new)
            yield from self.store.change_schedule_steps(name, p.cron, p.payload, p.timezone)
        if enabled is not None:
            yield from self.store.set_periodic_enabled_steps(name, enabled)
        return (yield from self._get_known(name))

    def delete(self, name: str) -> Steps[None]:
        return self._delete(check_schedule_name(name))

    def _delete(self, name: str) -> Steps[None]:
        if not (yield from self.store.delete_schedule_steps(name)):
            raise InvalidInput(_unknown(name))

    def _get_known(self, name: str) -> Steps[Schedule]:
        found = yield from self.store.stored_schedule_steps(name)
        assert found is not None  # read in the transaction that stored it
        return found


def _taken(name: str, at_run_time: bool) -> str:
    if at_run_time:
        return f"schedule {name!r} exists already: change it, or delete it first"
    return (
        f"schedule {name!r} is a schedule of the code (a scheduler has run it, or an operator switched it): "
        "a runtime schedule needs a name of its own"
    )


def _unknown(name: str) -> str:
    return (
        f"no schedule {name!r} was created at run time (a schedule of the code is changed in the code, "
        "and switched with enable/disable)"
    )


class Schedules:
    """Periodic schedules created at run time, on a :class:`~miniqueue.Client`'s connections.

    A change takes effect at the next pass of the reapers; a deleted schedule enqueues nothing more.
    """

    def __init__(self, client: SyncRunner) -> None:
        self._client = client
        self._steps = ScheduleSteps(client.store)

    def create(
        self,
        name: str,
        cron: str,
        *,
        task: str,
        payload: Any = None,
        timezone: str = "UTC",
        catch_up: str = "skip",
        grace: float = 300.0,
        enabled: bool = True,
        conn: Connection | None = None,
    ) -> Schedule:
        """Create schedule ``name``: a job of ``task`` with ``payload`` at each slot of ``cron``
        (read on the wall clock of ``timezone``), from the first slot after now. Options are
        those of :meth:`miniqueue.App.periodic`, checked by its rules (InvalidInput, nothing
        stored); a name taken, at run time or by a schedule of the code, is InvalidInput too."""
        schedule = checked(name, cron, task, payload, timezone, catch_up, grace)
        return self._client._run(self._steps.create(schedule, enabled), conn)

    def overview(
        self, code: Mapping[str, Periodic] | None = None, *, conn: Connection | None = None
    ) -> list[ListedSchedule]:
        """Every schedule: those of ``code`` (an app's ``schedules``), then those of the database
        by name: each a scheduler has run or an operator switched (without ``code``, their
        definitions are unknown here) and each created at run time; with whether it is enabled
        and its last slot."""
        return self._client._run(self._steps.overview(code or {}), conn)

    def list(self, *, conn: Connection | None = None) -> list[Schedule]:
        """Every schedule created at run time, by name."""
        return self._client._run(self._steps.list(), conn)

    def get(self, name: str, *, conn: Connection | None = None) -> Schedule | None:
        """Schedule ``name`` if it was created at run time, else None."""
        return self._client._run(self._steps.get(name), conn)

    def change(
        self,
        name: str,
        *,
        cron: str | None = None,
        payload: Any = UNCHANGED,
        timezone: str | None = None,
        enabled: bool | None = None,
        conn: Connection | None = None,
    ) -> Schedule:
        """Change what is given of schedule ``name`` (``payload=None`` stores an empty payload).
        Checked as at create; the slots already enqueued stay enqueued, none is enqueued again."""
        return self._client._run(self._steps.change(name, cron, payload, timezone, enabled), conn)

    def delete(self, name: str, *, conn: Connection | None = None) -> None:
        """Delete schedule ``name`` (InvalidInput if it was not created at run time); its jobs
        already enqueued stay."""
        self._client._run(self._steps.delete(name), conn)


class AsyncSchedules:
    """:class:`Schedules` on an :class:`~miniqueue.AsyncClient`'s connections."""

    def __init__(self, client: AsyncRunner) -> None:
        self._client = client
        self._steps = ScheduleSteps(client.store)

    async def create(
        self,
        name: str,
        cron: str,
        *,
        task: str,
        payload: Any = None,
        timezone: str = "UTC",
        catch_up: str = "skip",
        grace: float = 300.0,
        enabled: bool = True,
        conn: AsyncConnection | None = None,
    ) -> Schedule:
        """See :meth:`Schedules.create`."""
        schedule = checked(name, cron, task, payload, timezone, catch_up, grace)
        return await self._client._run(self._steps.create(schedule, enabled), conn)

    async def overview(
        self, code: Mapping[str, Periodic] | None = None, *, conn: AsyncConnection | None = None
    ) -> list[ListedSchedule]:
        """See :meth:`Schedules.overview`."""
        return await self._client._run(self._steps.overview(code or {}), conn)

    async def list(self, *, conn: AsyncConnection | None = None) -> list[Schedule]:
        """See :meth:`Schedules.list`."""
        return await self._client._run(self._steps.list(), conn)

    async def get(self, name: str, *, conn: AsyncConnection | None = None) -> Schedule | None:
        """See :meth:`Schedules.get`."""
        return await self._client._run(self._steps.get(name), conn)

    async def change(
        self,
        name: str,
        *,
        cron: str | None = None,
        payload: Any = UNCHANGED,
        timezone: str | None = None,
        enabled: bool | None = None,
        conn: AsyncConnection | None = None,
    ) -> Schedule:
        """See :meth:`Schedules.change`."""
        return await self._client._run(self._steps.change(name, cron, payload, timezone, enabled), conn)

    async def delete(self, name: str, *, conn: AsyncConnection | None = None) -> None:
        """See :meth:`Schedules.delete`."""
        await self._client._run(self._steps.delete(name), conn)
