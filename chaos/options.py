"""What a chaos run does: the options, checked, and the miniqueue settings derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: With ``--databases N``: a database's server stopped mid-run and started again (the outage run's one
#: fault; a scenario among the others in a full run over several databases).
STOP_DATABASE = "stop-database"

#: Every scenario the harness can inject, in the order the report lists them.
SCENARIOS = (
    "kill-worker",
    "kill-reaper",
    "stop-worker",
    "terminate-backend",
    "restart-postgres",
    "kill-supervisor",
    "two-supervisors",
    "pin-horizon",
)

#: How often each scenario is drawn after the first round (which injects each one once).
#: Kills dominate: they are what the harness is for, and the long form needs 200 of them.
WEIGHTS = {
    "kill-worker": 10.0,
    "kill-reaper": 2.0,
    "stop-worker": 1.5,
    "terminate-backend": 2.0,
    "restart-postgres": 0.6,
    "kill-supervisor": 1.0,
    "two-supervisors": 1.0,
    "pin-horizon": 1.0,
    STOP_DATABASE: 0.6,
}

KILLS = ("kill-worker", "kill-reaper", "kill-supervisor")

#: Every fault the harness can inject: the scenarios, and a database's outage over several.
ALL_SCENARIOS = (*SCENARIOS, STOP_DATABASE)
#: ``pin-horizon``: how long the snapshot is held open (seconds, drawn), longer than a lease.
PIN_SECONDS = (5.0, 12.0)
#: ``stop-database`` in a full run over several databases: how long the server stays down.
STOP_DATABASE_SECONDS = (3.0, 6.0)
#: The stopped database's weight in the map (the others': 1). Its jobs wait out the outage, so it
#: has the most left afterwards; twice the workers drain that in about half the time, which keeps
#: the short form short. The rate the rule compares is the other databases', so it is unaffected.
STOPPED_WEIGHT = 2
#: ``--databases``' defaults: workers per unit of weight, the handler's sleep, and jobs per
#: database per second of (outage_after + outage). Two workers sleeping 250 ms on average finish
#: at most 8 jobs a second, so 10 leave a quarter to spare: the other databases still have jobs
#: waiting when the outage ends, however idle the machine. The sleep dwarfs the few ms a job
#: costs in CPU, so a busy machine (CI runs tests beside it) moves the rate little.
SHARDED_WORKERS_PER_WEIGHT = 2
SHARDED_SLEEP_MS = (200, 300)
SHARDED_JOBS_PER_SECOND = 10

#: With ``--limits``: the concurrency keys a share of the jobs carry, and each one's
#: ``max_concurrent``. Every job naming a key is enqueued with that key's limit.
LIMIT_KEYS = {"key-0": 1, "key-1": 1, "key-2": 1, "key-3": 1, "key-4": 2}

#: With ``--fair`` (chaos.check_fair): the tenant keys the plain jobs without a concurrency key take
#: turns by, the rule that limits them (at most FAIR_RULE_LIMIT running each), and a key the rules
#: weigh: its pattern and its weight.
FAIR_TENANTS = ("tenant-0", "tenant-1", "tenant-2")
FAIR_RULE, FAIR_RULE_LIMIT = "tenant-*", 1
FAIR_WEIGHTED = ("tenant-0", 3.0)

#: With ``--unique`` and ``--sequences``: how the keys are named (``unique-0``, ``seq-0``, ...).
UNIQUE_PREFIX = "unique-"
SEQUENCE_PREFIX = "seq-"


#: With ``--batches``: the batch task's options (chaos.batches). Fixed, since the supervisors load
#: the task at import: a batch starts with BATCH_SIZE jobs ready on a worker, or once the oldest
#: has waited BATCH_WAIT seconds.
BATCH_SIZE = 8
BATCH_WAIT = 0.3

#: ``--everything``: every mode the harness has, at once, over two databases, under every fault
#: it can inject there, with the report. The one place that says what "everything" is: the CLI
#: sets these options (one given on the command line wins), the run is the run of those options.
EVERYTHING: dict[str, Any] = {
    "limits": True,
    "workflow": True,
    "unique": True,
    "sequences": True,
    "durable": True,
    "batches": True,
    "databases": 2,
    "scenarios": ALL_SCENARIOS,
    "report": True,
    "fair": True,
}
#: The modes a run over several databases may add to its plain jobs: with one of them (or a
#: scenario list of its own), ``--databases N`` is the full run over N databases; without, it is
#: the outage run (chaos.sharded).
MODES = ("limits", "workflow", "unique", "sequences", "durable", "batches", "async_handlers", "fair")


def sharded_defaults(databases: int, outage: float, outage_after: float) -> tuple[int, int, tuple[int, int]]:
    """``--jobs``, ``--workers`` and ``--sleep-ms`` when a run over ``databases`` leaves them out."""
    jobs = databases * round(SHARDED_JOBS_PER_SECOND * (outage_after + outage))
    workers = SHARDED_WORKERS_PER_WEIGHT * (databases - 1 + STOPPED_WEIGHT)
    return jobs, workers, SHARDED_SLEEP_MS


class OptionError(ValueError):
    """An option is out of range; the message names it and the rule."""


@dataclass(frozen=True)
class Options:
    """One chaos run. Durations in seconds."""

    jobs: int = 300
    workers: int = 4
    concurrency: int = 1
    #: Run the chaos app's ``async def`` handler (``chaos.app:async_app``) instead of its ``def`` one.
    async_handlers: bool = False
    duration: float = 30.0
    kill_interval: tuple[float, float] = (0.5, 1.5)
    seed: int = 0
    scenarios: tuple[str, ...] = SCENARIOS
    database_url: str | None = None
    lease_duration: float = 3.0
    effect_share: float = 0.5
    sleep_ms: tuple[int, int] = (10, 100)
    max_attempts: int = 25
    allow_dead: bool = False
    drain_timeout: float = 120.0
    spread: float | None = None
    json_path: Path | None = None
    workdir: Path | None = None
    keep: bool = False
    verbose: bool = False
    #: Give a share of the jobs a concurrency key (:data:`LIMIT_KEYS`), and check the limits held.
    limits: bool = False
    limit_share: float = 0.3
    #: Make every plain job fair (chaos.check_fair): by its concurrency key, else by a tenant key
    #: that a rule limits; and check that no tenant key ran more jobs at once than its rule allows.
    fair: bool = False
    #: Enqueue groups (members and a ``then`` callback) and chains among the jobs, and check that
    #: every dependent ran once, after its parents completed.
    workflow: bool = False
    groups: int = 10
    group_size: int = 10
    chains: int = 10
    chain_length: int = 5
    #: Enqueue a share of the jobs with a unique key (of ``unique_keys`` keys), over the run and
    #: again and again (duplicates expected), and check that no two jobs of a key ever ran at once.
    unique: bool = False
    unique_share: float = 0.2
    unique_keys: int = 4
    #: Enqueue ``sequence_keys`` x ``sequence_length`` jobs with a sequence key, over the run, and
    #: check that each key's jobs ran one at a time in enqueue order; the last key's second job
    #: fails until it is dead, which must block the key until the harness releases it at the end.
    sequences: bool = False
    sequence_keys: int = 10
    sequence_length: int = 5
    #: Enqueue ``durable_jobs`` durable jobs (five steps, two sleeps, a signal: chaos.durable_jobs) and
    #: check that no recorded step ran again and no sleep or wait spent an attempt.
    durable: bool = False
    durable_jobs: int = 40
    #: Run over this many databases, each on an embedded server of the harness's own, one shard
    #: map over them (``--databases``; see chaos.sharded). With more than one, the run's fault is
    #: one server stopped ``outage_after`` seconds after the enqueue, for ``outage`` seconds.
    databases: int = 1
    outage: float = 10.0
    outage_after: float = 5.0
    #: Also SIGKILL the stopped database's supervisor while its server is down.
    kill_in_outage: bool = False
    #: Enqueue a share of the plain jobs as jobs of a batch task (chaos.batches: BATCH_SIZE at a
    #: time), and check that no batch was larger and that a batch's jobs interrupted by a crash
    #: ran alone next.
    batches: bool = False
    batch_share: float = 0.3
    #: Write the Markdown report (with its plots) to ``report_path``, by default the run
    #: directory's ``report.md``; a passing run that removes its directory keeps the report.
    report: bool = False
    report_path: Path | None = None
    #: Set by ``--everything`` (its options are already applied: see EVERYTHING).
    everything: bool = False

    # Short miniqueue intervals, so that lease expiry and recovery happen many times a run.
    poll_interval: float = 0.2
    reaper_interval: float = 1.0
    shutdown_timeout: float = 3.0
    #: The supervisor kills a child silent for this long (miniqueue's default); a stopped
    #: worker must be resumed well before it, or the kill would hide the late completion.
    liveness_timeout: float = 30.0

    @property
    def app(self) -> str:
        """The app reference the supervisors run. chaos.durable_jobs adds its task to chaos.app's, and
        chaos.batches its own to chaos.durable_jobs's (idle without ``--durable``); the batch task
        only with ``--batches``, since a worker holds whole batches of it, which changes its prefetch."""
        module = "chaos.batches" if self.batches else "chaos.durable_jobs" if self.durable else "chaos.app"
        return f"{module}:async_app" if self.async_handlers else f"{module}:app"

    @property
    def modes(self) -> list[str]:
        """The modes on (of MODES), and ``scenarios`` when the scenario list is not the default."""
        on = [mode for mode in MODES if getattr(self, mode)]
        return on + (["scenarios"] if self.scenarios != SCENARIOS else [])

    @property
    def outage_run(self) -> bool:
        """``--databases N`` with no mode: the outage run (one server stopped, the others'
        throughput meanwhile: chaos.sharded) rather than the full run over N databases."""
        return self.sharded and not self.modes

    @property
    def heartbeat(self) -> float:
        return self.lease_duration / 3

    @property
    def enqueue_spread(self) -> float:
        """Jobs become available over this many seconds, so the queue drains under fire
        instead of emptying before the first fault."""
        if self.spread is not None:
            return self.spread
        # In the outage run every job is due at once: the workers stay busy, so the rate measured
        # around the outage is theirs, not the arrival rate.
        return 0.0 if self.outage_run else self.duration * 0.8

    @property
    def sharded(self) -> bool:
        """Whether the run is over several databases (``--databases`` above 1)."""
        return self.databases > 1

    @property
    def stop_bounds(self) -> tuple[float, float]:
        """How long a SIGSTOP lasts: at least the lease plus a reaper pass (so the lease is
        recovered and re-claimed), at most well inside the supervisor's liveness timeout."""
        shortest = self.lease_duration + self.reaper_interval + 1.0
        return shortest, max(shortest, min(self.liveness_timeout - 8.0, 4 * self.lease_duration + self.reaper_interval))

    @property
    def workflow_jobs(self) -> int:
        """How many of the jobs belong to a group (members and callback) or a chain."""
        if not self.workflow:
            return 0
        return self.groups * (self.group_size + 1) + self.chains * self.chain_length

    @property
    def sequence_jobs(self) -> int:
        """How many of the jobs carry a sequence key."""
        return self.sequence_keys * self.sequence_length if self.sequences else 0

    @property
    def batch_jobs(self) -> int:
        """How many of the plain jobs (neither in a workflow, a sequence nor a unique key's) are
        jobs of the batch task."""
        if not self.batches:
            return 0
        plain = self.jobs - self.workflow_jobs - self.sequence_jobs - self.unique_jobs
        return round(self.batch_share * max(0, plain))

    @property
    def unique_jobs(self) -> int:
        """How many of the jobs are enqueues of a unique key (each one stores a job or is a
        duplicate): a share of those neither in a workflow nor in a sequence."""
        if not self.unique:
            return 0
        return round(self.unique_share * max(0, self.jobs - self.workflow_jobs - self.sequence_jobs))

    @property
    def keyed(self) -> bool:
        """Whether some jobs carry a unique or sequence key (``--unique``, ``--sequences``)."""
        return self.unique or self.sequences

    def unique_key_names(self) -> list[str]:
        return [f"{UNIQUE_PREFIX}{n}" for n in range(self.unique_keys)]

    def sequence_key_names(self) -> list[str]:
        return [f"{SEQUENCE_PREFIX}{n}" for n in range(self.sequence_keys)]

    def validated(self) -> Options:
        checks = [
            (self.jobs >= 1, f"--jobs {self.jobs}: use 1 or more"),
            (self.workers >= 1, f"--workers {self.workers}: use 1 or more"),
            (self.concurrency >= 1, f"--concurrency {self.concurrency}: use 1 or more"),
            (self.duration >= 0, f"--duration {self.duration}: use 0 or more seconds"),
            (
                0 < self.kill_interval[0] <= self.kill_interval[1],
                f"--kill-interval {self.kill_interval}: use 0 < MIN <= MAX",
            ),
            (
                0.5 <= self.lease_duration <= 10,
                f"--lease-duration {self.lease_duration}: use 0.5 to 10 seconds (short, so leases expire under chaos)",
            ),
            (0 <= self.effect_share <= 1, f"--effect-share {self.effect_share}: use a fraction from 0 to 1"),
            (0 <= self.sleep_ms[0] <= self.sleep_ms[1], f"--sleep-ms {self.sleep_ms}: use 0 <= MIN <= MAX"),
            (self.max_attempts >= 1, f"--max-attempts {self.max_attempts}: use 1 or more"),
            (self.drain_timeout > 0, f"--drain-timeout {self.drain_timeout}: use a positive number of seconds"),
            (self.spread is None or self.spread >= 0, f"--spread {self.spread}: use 0 or more seconds"),
            (0 <= self.limit_share <= 1, f"--limit-share {self.limit_share}: use a fraction from 0 to 1"),
            (
                min(self.groups, self.group_size, self.chains, self.chain_length) >= 0,
                "--groups, --group-size, --chains, --chain-length: use 0 or more",
            ),
            (
                self.groups == 0 or self.group_size >= 1,
                f"--group-size {self.group_size}: a group needs at least one member",
            ),
            (
                self.workflow_jobs <= self.jobs,
                f"--jobs {self.jobs}: --workflow needs at least {self.workflow_jobs} (its groups and chains)",
            ),
            (0 <= self.unique_share <= 1, f"--unique-share {self.unique_share}: use a fraction from 0 to 1"),
            (self.unique_keys >= 1, f"--unique-keys {self.unique_keys}: use 1 or more"),
            (self.sequence_keys >= 1, f"--sequence-keys {self.sequence_keys}: use 1 or more"),
            (self.durable_jobs >= 1, f"--durable-jobs {self.durable_jobs}: use 1 or more"),
            (0 <= self.batch_share <= 1, f"--batch-share {self.batch_share}: use a fraction from 0 to 1"),
            (
                self.sequence_length >= 3,
                f"--sequence-length {self.sequence_length}: use 3 or more (the blocked key's second job dies, "
                "and at least one must wait behind it)",
            ),
            (
                self.workflow_jobs + self.sequence_jobs <= self.jobs,
                f"--jobs {self.jobs}: --workflow and --sequences need at least "
                f"{self.workflow_jobs + self.sequence_jobs} (groups, chains and sequences)",
            ),
        ]
        for ok, message in [*checks, *self._sharded_checks()]:
            if not ok:
                raise OptionError(message)
        unknown = [s for s in self.scenarios if s not in ALL_SCENARIOS]
        if unknown or not self.scenarios:
            raise OptionError(f"--scenarios {','.join(self.scenarios)}: choose among {','.join(ALL_SCENARIOS)}")
        if STOP_DATABASE in self.scenarios and (not self.sharded or self.outage_run):
            raise OptionError(
                f"--scenarios {STOP_DATABASE}: needs a full run over several databases (--databases N with a mode)"
            )
        return self

    def _sharded_checks(self) -> list[tuple[bool, str]]:
        """What ``--databases`` needs: servers of its own and a worker per database; the outage
        run's options only in the outage run."""
        n = self.databases
        outage_only = [flag for flag, on in (("--kill-in-outage", self.kill_in_outage),) if on]
        return [
            (1 <= n <= 8, f"--databases {n}: use 1 to 8 (each is a server of the harness's own)"),
            (
                n == 1 or self.database_url is None,
                f"--databases {n}: runs on servers of its own; drop --database-url",
            ),
            (
                self.outage_run or not outage_only,
                f"{', '.join(outage_only)}: only in the outage run (--databases N with no mode)",
            ),
            (not self.outage_run or not self.report, "--report: the outage run (--databases N alone) writes none"),
            (n == 1 or self.workers >= n, f"--workers {self.workers}: --databases {n} needs one per database"),
            (self.outage > 0, f"--outage {self.outage}: use a positive number of seconds"),
            (
                self.outage_after >= 2,
                f"--outage-after {self.outage_after}: use 2 or more seconds (the rate before the outage "
                "is measured from 1 s after the enqueue)",
            ),
        ]
