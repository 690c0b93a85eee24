"""A run over several databases (``--databases N``), from start to verdict: N servers and one
shard map over their databases, ``miniqueue-supervise --shards`` (a supervisor per database, the
workers shared by weight), the jobs spread over every database, one server stopped mid-run and
started again, the drain, the graceful stop, the checks, the report, the cleanup.

The checks are the single-database run's, on the records of every database merged (each check
goes by job id, and ids name their database), plus the outage's (chaos.outage) and, per
database, whether every job of it completed exactly once.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from miniqueue.core.shard_map import MODULUS

from .databases import Databases, Shard, enqueue_sharded
from .evidence import Evidence
from .fleet import Fleet
from .options import STOP_DATABASE, STOPPED_WEIGHT, Options
from .outage import Outage, drain_all, outage_rows, run_outage
from .processes import become_subreaper
from .report import table, write_json
from .rows import Row, rule
from .run import REPO_ROOT, Narrator, run_facts
from .server import snapshot_code
from .supervisors import SupervisorLog, supervisor_rows
from .verify import RunRecord, Verdict, judge
from .workload import Workload

#: How long the supervisors (one per database under the one started) may take to be ready.
READY_TIMEOUT = 60.0


def run_sharded(options: Options) -> int:
    say = Narrator()
    rng = random.Random(options.seed)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="miniqueue-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    become_subreaper()  # Linux only; elsewhere orphans go to init, and are only checked at the end
    databases = Databases(workdir)
    fleet: Fleet | None = None
    ok = False
    try:
        code = snapshot_code(REPO_ROOT, workdir)
        outage = _start_databases(options, databases, code, rng, say)
        fleet = Fleet(databases.shards[0].server.dsn, options, workdir, code, say, shards=databases.map_path)
        _start_fleet(fleet, options.databases)
        workload = enqueue_sharded(databases.map, options, rng)
        outage.enqueued = time.time()
        say(f"enqueued {len(workload.ids)} jobs: {_per_database(workload.ids, databases.shards)}")
        run_outage(options, fleet, databases, outage, say)
        drain_seconds, drain_error = drain_all(options, fleet, databases, say)
        fleet.stop_all()
        elapsed = time.time() - outage.enqueued
        verdict = _judge(options, databases, fleet, workload, outage, drain_seconds, drain_error)
        title = _title(options, databases, outage, elapsed, workdir)
        print(table(title, verdict), flush=True)
        if options.json_path:
            write_json(options.json_path, title, verdict, run_facts(options, outage.faults, say.t0, workdir))
        ok = verdict.ok
        return 0 if ok else 1
    except BaseException:
        if fleet is not None:
            fleet.kill_everything()
        raise
    finally:
        keep = options.keep or not ok
        databases.cleanup(keep)
        if keep:
            say(f"kept the run: logs, the shard map and each server's data in {workdir} (servers stopped)")
        elif options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def _start_databases(options: Options, databases: Databases, code: Path, rng: random.Random, say: Narrator) -> Outage:
    """Draw the database to stop (it gets the weight STOPPED_WEIGHT), start every server and
    database; the outage to come."""
    stopped = rng.randrange(options.databases)
    databases.start([STOPPED_WEIGHT if i == stopped else 1 for i in range(options.databases)], code, say)
    return Outage(databases.shards[stopped], enqueued=0.0)


def _start_fleet(fleet: Fleet, databases: int) -> None:
    """Start ``miniqueue-supervise --shards`` and wait until each database's supervisor has said
    READY=1 (each sends its own, on the socket the process above them was given)."""
    supervisor = fleet.start()
    deadline = time.monotonic() + READY_TIMEOUT
    supervisor.wait_ready(timeout=READY_TIMEOUT)
    while supervisor.notifications().count("READY=1") < databases:
        if time.monotonic() > deadline or not supervisor.alive:
            raise RuntimeError(f"not every database's supervisor became ready:\n{supervisor.log_tail()}")
        time.sleep(0.05)


def _judge(
    options: Options,
    databases: Databases,
    fleet: Fleet,
    workload: Workload,
    outage: Outage,
    drain_seconds: float | None,
    drain_error: str | None,
) -> Verdict:
    evidence = Evidence.merged([Evidence.load(s.db, s.offset) for s in databases.shards])
    survivors, zombies = fleet.leftovers()
    logs = "\n".join(s.output() for s in fleet.supervisors)
    record = RunRecord(
        options=options,
        enqueued=workload.ids,
        effect_jobs=workload.effect_jobs,
        sleep_ms=workload.sleep_ms,
        workload=workload,
        faults=outage.faults,
        stops=[],
        process_problems=fleet.problems,
        external_stops=fleet.external_stops,
        survivors=survivors,
        zombies_left=zombies,
        orphans_adopted=fleet.tracker.reaped_orphans,
        logs=logs,
        drain_seconds=drain_seconds,
        drain_error=drain_error,
    )
    verdict = judge(evidence, record)
    rows = _database_rows(evidence, workload, databases.shards, verdict.data)
    rows += outage_rows(evidence, outage, databases.shards, verdict.data)
    rows += supervisor_rows(SupervisorLog.parse(logs), outage.shard.name, outage.up, outage.kill, verdict.data)
    verdict.rows = [*rows, *verdict.rows]
    return verdict


def _database_rows(ev: Evidence, workload: Workload, shards: list[Shard], data: dict[str, Any]) -> list[Row]:
    """Per database: every job it holds completed exactly once (one completion transition)."""
    rows: list[Row] = []
    report: dict[str, dict[str, Any]] = {}
    for shard in shards:
        jobs = [j for j in workload.ids if j % MODULUS == shard.index]
        bad = []
        for job in jobs:
            state, completions = ev.states.get(job, ("missing", 0))[0], len(ev.completions.get(job, []))
            if state != "completed" or completions != 1:
                bad.append(f"{job} ({state}, {completions} completion(s))")
        once = len(jobs) - len(bad)
        report[shard.name] = {"index": shard.index, "enqueued": len(jobs), "completed_once": once, "not_once": bad}
        rows.append(
            rule(f"{shard.name}: jobs not completed exactly once", bad, value=f"{len(bad)} ({once} of {len(jobs)} did)")
        )
    data["databases"] = report
    return rows


def _per_database(ids: list[int], shards: list[Shard]) -> str:
    return ", ".join(f"{s.name} {sum(1 for j in ids if j % MODULUS == s.index)}" for s in shards)


def _title(options: Options, databases: Databases, outage: Outage, elapsed: float, workdir: Path) -> list[str]:
    shard = outage.shard
    return [
        f"miniqueue chaos over {options.databases} databases: {options.jobs} jobs, {options.workers} workers x "
        f"{options.concurrency} thread(s) shared by weight; {shard.name}'s server stopped "
        f"{options.outage_after:g}s after the enqueue for {options.outage:g}s; seed {options.seed}",
        f"servers: {databases.shards[0].server.describe()} and {options.databases - 1} more like it; lease "
        f"{options.lease_duration:g}s, heartbeat {options.heartbeat:g}s, reaper {options.reaper_interval:g}s; "
        f"scenarios: {STOP_DATABASE}",
        f"enqueue to graceful stop {elapsed:.0f}s; run directory {workdir}",
    ]
