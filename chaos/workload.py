"""The jobs of a run, enqueued once the supervisors are ready.

Every job runs the one chaos task; its payload says how long the handler sleeps and whether it
completes through ``job.transaction()`` (an *effect* job). Plain jobs become available at a
random time over the spread, so the queue drains under fire.

With ``--limits`` a share of the jobs carry a concurrency key (:data:`~chaos.options.LIMIT_KEYS`),
with that key's ``max_concurrent``. A key's jobs become due in a few bursts, so that they queue
for the key's slots instead of rarely meeting.

With ``--workflow`` some of the jobs form groups (members due together, then a callback) and
chains (the first step due at a random time, each next one waiting for the one before). Every
dependent (a callback, a step after the first) is an effect job: its completion is
transactional, so a second completion would leave a duplicated effect. Dependents wait for
their parents, so they get no delay; with ``--limits`` they may carry a key like any job.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from miniqueue import Client, JobSpec

from .app import QUEUE, TASK
from .options import LIMIT_KEYS, Options

#: Due times per concurrency key: its jobs are due at one of these, plus up to BURST_JITTER s.
BURSTS_PER_KEY = 3
BURST_JITTER = 0.5
#: A group's members are due within this many seconds of each other.
GROUP_JITTER = 2.0

GROUP_CALLBACK = "group callback"
CHAIN_STEP = "chain step"


@dataclass(frozen=True)
class Planned:
    """One job to enqueue, and what the checks need to know about it."""

    spec: JobSpec
    effect: bool
    sleep_ms: int
    key: str | None


@dataclass
class Workload:
    """The jobs of a run: their ids, those that complete transactionally, each one's handler
    sleep; with ``--limits`` each keyed job's key; with ``--workflow`` the groups, the chains and
    each dependent's parents."""

    ids: list[int] = field(default_factory=list)
    effect_jobs: set[int] = field(default_factory=set)
    sleep_ms: dict[int, int] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)
    #: Each dependent's parents, in the order given, and its role (GROUP_CALLBACK or CHAIN_STEP).
    parents: dict[int, tuple[int, ...]] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    groups: list[tuple[list[int], int]] = field(default_factory=list)  # (members, callback)
    chains: list[list[int]] = field(default_factory=list)

    def add(self, job: int, planned: Planned) -> None:
        self.ids.append(job)
        self.sleep_ms[job] = planned.sleep_ms
        if planned.effect:
            self.effect_jobs.add(job)
        if planned.key is not None:
            self.keys[job] = planned.key

    def depends(self, job: int, parents: list[int], role: str) -> None:
        self.parents[job] = tuple(parents)
        self.roles[job] = role


class Draw:
    """Each job's payload, due time and key, drawn from the run's seeded random numbers.

    A plain job draws exactly what it did before ``--limits`` and ``--workflow`` existed (effect,
    sleep, delay, in that order), so a seed without them keeps its schedule.
    """

    def __init__(self, options: Options, rng: random.Random) -> None:
        self.options, self.rng = options, rng
        spread = options.enqueue_spread
        self.bursts = (
            {key: [rng.uniform(0, spread) for _ in range(BURSTS_PER_KEY)] for key in LIMIT_KEYS}
            if options.limits
            else {}
        )

    def delay(self) -> float | None:
        """A due time over the spread (None: at once)."""
        spread = self.options.enqueue_spread
        return self.rng.uniform(0, spread) if spread else None

    def job(self, *, dependent: bool = False, near: float | None = None) -> Planned:
        """A job: a dependent (no delay, always an effect job), or due near ``near`` (a group's
        members), or at a random time; a keyed job is due at one of its key's bursts."""
        options = self.options
        effect = True if dependent else self.rng.random() < options.effect_share
        sleep = self.rng.randint(*options.sleep_ms)
        delay: float | None = None
        if not dependent:
            delay = self.delay() if near is None else near + self.rng.uniform(0, GROUP_JITTER)
        key = self.key()
        if key is not None and delay is not None:
            delay = self.rng.choice(self.bursts[key]) + self.rng.uniform(0, BURST_JITTER)
        spec = JobSpec(
            TASK,
            {"effect": effect, "ms": sleep},
            queue=QUEUE,
            delay=delay,
            max_attempts=options.max_attempts,
            concurrency_key=key,
            max_concurrent=LIMIT_KEYS[key] if key is not None else None,
        )
        return Planned(spec, effect, sleep, key)

    def key(self) -> str | None:
        """A concurrency key for a share of the jobs (with ``--limits``), else None."""
        if not self.options.limits or self.rng.random() >= self.options.limit_share:
            return None
        return self.rng.choice(sorted(LIMIT_KEYS))


def enqueue(dsn: str, options: Options, rng: random.Random) -> Workload:
    """Enqueue the run's jobs: its groups and chains (one transaction each), then the plain jobs
    in one statement."""
    draw = Draw(options, rng)
    workload = Workload()
    with Client(dsn) as client:
        if options.workflow:
            for _ in range(options.groups):
                _enqueue_group(client, draw, options.group_size, workload)
            for _ in range(options.chains):
                _enqueue_chain(client, draw, options.chain_length, workload)
        plain = [draw.job() for _ in range(options.jobs - options.workflow_jobs)]
        if plain:
            for result, planned in zip(client.enqueue_many([p.spec for p in plain]), plain, strict=True):
                workload.add(result.id, planned)
    return workload


def _enqueue_group(client: Client, draw: Draw, size: int, workload: Workload) -> None:
    """Members due within GROUP_JITTER s of each other, and a callback after all of them."""
    anchor = draw.delay()
    members = [draw.job(near=anchor) for _ in range(size)]
    then = draw.job(dependent=True)
    result = client.group([m.spec for m in members], then=then.spec)
    ids = [r.id for r in result.members]
    for job, planned in zip(ids, members, strict=True):
        workload.add(job, planned)
    workload.add(result.then.id, then)
    workload.depends(result.then.id, ids, GROUP_CALLBACK)
    workload.groups.append((ids, result.then.id))


def _enqueue_chain(client: Client, draw: Draw, length: int, workload: Workload) -> None:
    """A first step due at a random time, and steps that each wait for the one before."""
    if length == 0:
        return
    steps = [draw.job(), *(draw.job(dependent=True) for _ in range(length - 1))]
    ids = [r.id for r in client.chain([s.spec for s in steps])]
    for index, (job, planned) in enumerate(zip(ids, steps, strict=True)):
        workload.add(job, planned)
        if index:
            workload.depends(job, [ids[index - 1]], CHAIN_STEP)
    workload.chains.append(ids)
