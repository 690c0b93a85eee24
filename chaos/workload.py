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

With ``--unique`` and ``--sequences`` some jobs carry a unique key or a sequence key. They are
not enqueued with the others: each is drawn here as part of a *feed* (a burst of enqueues of one
key, due at a time over the spread, through ``app.enqueue``, ``client.enqueue`` or
``client.enqueue_many``), and :mod:`chaos.feeder` enqueues them while the faults fly. A unique
key's bursts repeat its enqueues a few tenths of a second apart, so most are duplicates of a job
that waits or runs and some land just as it finishes. A sequence key's jobs come in one to three
bursts, in order; the last key's second job fails every time (``"fail"``, 2 attempts), so it dies
and blocks the rest of its key.

With ``--batches`` the last of the plain jobs are jobs of the batch task (chaos.batches), drawn as
plain jobs are (so the draws of a seed stay where they were) and enqueued with them.

Over several databases the plain jobs go round-robin (a ``ShardedClient``), a key's jobs to the
database of its hash; a group or a chain cannot span databases, so each is enqueued on one
database, in turn, through that database's own client.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

from miniqueue import Client, JobSpec
from miniqueue.client.sharded import ShardedClient

from .app import BATCH_TASK, QUEUE, SEQUENCE_TASK, TASK, UNIQUE_TASK
from .options import BATCH_SIZE, FAIR_TENANTS, LIMIT_KEYS, Options

#: Due times per concurrency key: its jobs are due at one of these, plus up to BURST_JITTER s.
BURSTS_PER_KEY = 3
BURST_JITTER = 0.5
#: A group's members are due within this many seconds of each other.
GROUP_JITTER = 2.0
#: ``--batches``: the batch task's jobs are due in bursts of this many (two batches' worth: over
#: two databases, one for each).
BATCH_BURST = 2 * BATCH_SIZE

GROUP_CALLBACK = "group callback"
CHAIN_STEP = "chain step"

#: How a feed enqueues its jobs: the app (its task computes the key from the payload), a client
#: without the app (the key passed), or one batch.
METHODS = ("app.enqueue", "client.enqueue", "client.enqueue_many")
#: A unique key's burst: up to this many enqueues, each up to UNIQUE_GAP s after the one before.
UNIQUE_BURST = 4
UNIQUE_GAP = 0.3
#: A sequence key's jobs come in up to this many bursts.
SEQUENCE_BURSTS = 3
#: The job planned to die: the blocked key's second job, with this many attempts.
FAILING_INDEX = 1
FAILING_ATTEMPTS = 2


@dataclass(frozen=True)
class Planned:
    """One job to enqueue, and what the checks need to know about it."""

    spec: JobSpec
    effect: bool
    sleep_ms: int
    key: str | None
    #: With --fair: the tenant key it takes turns by, when it has no concurrency key.
    tenant: str | None = None


@dataclass(frozen=True)
class Feed:
    """A burst of enqueues of one unique or sequence key, due ``at`` seconds into the chaos."""

    at: float
    kind: str  # "unique" or "sequence"
    key: str
    method: str  # one of METHODS
    jobs: tuple[Planned, ...]
    #: Seconds to wait before each enqueue (one by one; a batch goes at once).
    gaps: tuple[float, ...]


@dataclass
class KeyedEnqueue:
    """One enqueue of a keyed job, as the feeder made it: when (this host's clock), and what it
    returned. A retry after a connection error is the same enqueue (``retries``)."""

    kind: str
    key: str
    method: str
    n: int  # the job's index among its key's (payload "n")
    started: float
    ended: float
    id: int | None = None
    duplicate: bool = False
    retries: int = 0
    error: str | None = None


@dataclass
class Workload:
    """The jobs of a run: their ids, those that complete transactionally, each one's handler
    sleep; with ``--limits`` each keyed job's key; with ``--workflow`` the groups, the chains and
    each dependent's parents."""

    ids: list[int] = field(default_factory=list)
    effect_jobs: set[int] = field(default_factory=set)
    sleep_ms: dict[int, int] = field(default_factory=dict)
    keys: dict[int, str] = field(default_factory=dict)
    #: With --fair: each job that takes turns by a tenant key, and the key.
    tenants: dict[int, str] = field(default_factory=dict)
    #: Each dependent's parents, in the order given, and its role (GROUP_CALLBACK or CHAIN_STEP).
    parents: dict[int, tuple[int, ...]] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    groups: list[tuple[list[int], int]] = field(default_factory=list)  # (members, callback)
    chains: list[list[int]] = field(default_factory=list)
    #: With --unique and --sequences: the bursts to enqueue over the run, what each enqueue
    #: returned, each sequence key's jobs in the order the harness enqueued them, the job planned
    #: to die (and its key), and keyed jobs found only in the database (their reply was lost).
    feeds: list[Feed] = field(default_factory=list)
    enqueues: list[KeyedEnqueue] = field(default_factory=list)
    sequence_order: dict[str, list[int]] = field(default_factory=dict)
    failing: dict[int, str] = field(default_factory=dict)
    blocked_key: str | None = None
    found: list[int] = field(default_factory=list)
    #: With --batches: the jobs of the batch task.
    batch_jobs: set[int] = field(default_factory=set)

    def add(self, job: int, planned: Planned) -> None:
        self.ids.append(job)
        self.sleep_ms[job] = planned.sleep_ms
        if planned.effect:
            self.effect_jobs.add(job)
        if planned.key is not None:
            self.keys[job] = planned.key
        if planned.tenant is not None:
            self.tenants[job] = planned.tenant

    def add_found(self, job: int, payload: dict[str, object]) -> None:
        """A keyed job the database holds but no enqueue returned (its reply was lost)."""
        self.ids.append(job)
        self.found.append(job)
        ms = payload.get("ms", 0)
        self.sleep_ms[job] = int(ms) if isinstance(ms, (int, float)) else 0
        if payload.get("effect"):
            self.effect_jobs.add(job)
        if payload.get("fail") and isinstance(payload.get("sequence"), str):
            self.failing[job] = str(payload["sequence"])

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
        if not options.fair:
            return Planned(spec, effect, sleep, key)
        tenant = None if key is not None else self.rng.choice(FAIR_TENANTS)
        return Planned(spec._replace(fair_key=key or tenant), effect, sleep, key, tenant)

    def key(self) -> str | None:
        """A concurrency key for a share of the jobs (with ``--limits``), else None."""
        if not self.options.limits or self.rng.random() >= self.options.limit_share:
            return None
        return self.rng.choice(sorted(LIMIT_KEYS))

    def batch_jobs(self, drawn: list[Planned]) -> list[Planned]:
        """Plain jobs (drawn as any) made jobs of the batch task, due in bursts of BATCH_BURST each,
        within BURST_JITTER s of the burst's time, so that the batches fill (jobs due one by one
        would mostly run as batches of one)."""
        spread = self.options.enqueue_spread
        bursts = [self.rng.uniform(0, spread) for _ in range(-(-len(drawn) // BATCH_BURST))] if spread else []
        made = []
        for index, planned in enumerate(drawn):
            delay = bursts[index // BATCH_BURST] + self.rng.uniform(0, BURST_JITTER) if bursts else None
            made.append(dataclasses.replace(planned, spec=planned.spec._replace(task=BATCH_TASK, delay=delay)))
        return made

    def keyed_job(
        self, *, n: int, unique: str | None = None, sequence: str | None = None, fail: bool = False
    ) -> Planned:
        """A job of a unique or a sequence key (due when its feed is: no delay). Its payload names
        its key and its index ``n``, so a job whose enqueue reply was lost can be told apart in the
        database. It carries no concurrency key: limits are scoped per task, and the limits rule
        (``--limits``) checks the chaos task's keys."""
        options = self.options
        effect = False if fail else self.rng.random() < options.effect_share
        sleep = self.rng.randint(*options.sleep_ms)
        payload: dict[str, object] = {"effect": effect, "ms": sleep, "n": n}
        if unique is not None:
            payload["unique"] = unique
        if sequence is not None:
            payload["sequence"] = sequence
        if fail:
            payload["fail"] = True
        spec = JobSpec(
            UNIQUE_TASK if unique is not None else SEQUENCE_TASK,
            payload,
            queue=QUEUE,
            max_attempts=FAILING_ATTEMPTS if fail else options.max_attempts,
            # A sequence job is enqueued once, even when its enqueue is retried after a lost
            # reply; a unique job's retry is an enqueue like any other.
            idempotency_key=None if sequence is None else f"chaos:{sequence}:{n}",
            unique_key=unique,
            sequence_key=sequence,
        )
        return Planned(spec, effect, sleep, None)

    def unique_feeds(self) -> list[Feed]:
        """``--unique``: the unique enqueues, in bursts of one key each (most of a burst's
        enqueues are duplicates of its first)."""
        keys = self.options.unique_key_names()
        feeds: list[Feed] = []
        count, n = self.options.unique_jobs, 0
        spread = self.options.enqueue_spread
        while n < count:
            size = min(self.rng.randint(1, UNIQUE_BURST), count - n)
            key = self.rng.choice(keys)
            at = self.rng.uniform(0, spread)
            method = self.rng.choice(METHODS)
            jobs = tuple(self.keyed_job(n=n + i, unique=key) for i in range(size))
            gaps = tuple(0.0 if i == 0 else self.rng.uniform(0, UNIQUE_GAP) for i in range(size))
            feeds.append(Feed(at, "unique", key, method, jobs, gaps))
            n += size
        return feeds

    def sequence_feeds(self) -> tuple[list[Feed], str]:
        """``--sequences``: each key's jobs in one to three bursts, in order; and the key whose
        second job is planned to die."""
        keys = self.options.sequence_key_names()
        blocked = keys[-1]
        length = self.options.sequence_length
        spread = self.options.enqueue_spread
        feeds: list[Feed] = []
        for key in keys:
            cuts = sorted(self.rng.sample(range(1, length), k=self.rng.randint(0, SEQUENCE_BURSTS - 1)))
            bounds = [0, *cuts, length]
            times = sorted(self.rng.uniform(0, spread) for _ in [*cuts, 0])
            for at, lo, hi in zip(times, bounds[:-1], bounds[1:], strict=True):
                jobs = tuple(
                    self.keyed_job(n=i, sequence=key, fail=key == blocked and i == FAILING_INDEX) for i in range(lo, hi)
                )
                gaps = tuple(self.rng.uniform(0, 0.05) for _ in jobs)
                feeds.append(Feed(at, "sequence", key, self.rng.choice(METHODS), jobs, gaps))
        return feeds, blocked


def enqueue(client: Client | ShardedClient, options: Options, rng: random.Random) -> Workload:
    """Enqueue the run's jobs: its groups and chains (one transaction each, each on one database),
    then the plain jobs (the batch task's among them) in one statement per database."""
    draw = Draw(options, rng)
    workload = Workload()
    flows: list[Client] = (
        [client.client(name) for name in client.shards.databases] if isinstance(client, ShardedClient) else [client]
    )
    if options.workflow:
        for n in range(options.groups):
            _enqueue_group(flows[n % len(flows)], draw, options.group_size, workload)
        for n in range(options.chains):
            _enqueue_chain(flows[n % len(flows)], draw, options.chain_length, workload)
    plain_count = options.jobs - options.workflow_jobs - options.sequence_jobs - options.unique_jobs
    plain = [draw.job() for _ in range(plain_count)]
    batched = plain_count - options.batch_jobs
    plain[batched:] = draw.batch_jobs(plain[batched:])
    if plain:
        for result, planned in zip(client.enqueue_many([p.spec for p in plain]), plain, strict=True):
            workload.add(result.id, planned)
            if planned.spec.task == BATCH_TASK:
                workload.batch_jobs.add(result.id)
    if options.unique:
        workload.feeds += draw.unique_feeds()
    if options.sequences:
        feeds, workload.blocked_key = draw.sequence_feeds()
        workload.feeds += feeds
    # In time order; a key's bursts are drawn in order, and a stable sort keeps equal times so.
    workload.feeds.sort(key=lambda feed: feed.at)
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
