"""One chaos run from start to verdict: servers and databases (one, or several under a shard
map: chaos.site), supervisor, jobs, chaos, drain, graceful stop, checks, report, cleanup."""

from __future__ import annotations

import dataclasses
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .check_durable import durable_rows
from .check_fair import set_rules
from .durable_jobs import Signaller, enqueue_durable
from .faults import Fault, Injector
from .feeder import Blocked, Feeder, reconcile, release_blocked
from .fleet import Fleet
from .options import Options
from .processes import become_subreaper
from .report import table, write_json, write_report
from .schedule import OWNED_ONLY, drain, run_chaos
from .server import snapshot_code
from .site import Site
from .timeline import Sampler, Timeline
from .verify import RunRecord, Verdict, judge
from .workload import Workload, enqueue

REPO_ROOT = Path(__file__).resolve().parent.parent


class Narrator:
    """Progress lines on stderr, stamped with the seconds since the run began."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[chaos {time.monotonic() - self.t0:7.2f}s] {message}", file=sys.stderr, flush=True)


def _extras(workload: Workload) -> str:
    """What the progress line adds for ``--limits`` and ``--workflow``."""
    parts = []
    if workload.keys:
        parts.append(f"{len(workload.keys)} with a concurrency key")
    if workload.groups or workload.chains:
        parts.append(f"{len(workload.groups)} groups and {len(workload.chains)} chains")
    if workload.batch_jobs:
        parts.append(f"{len(workload.batch_jobs)} of the batch task")
    for kind in ("unique", "sequence"):
        feeds = [f for f in workload.feeds if f.kind == kind]
        if feeds:
            parts.append(f"{sum(len(f.jobs) for f in feeds)} {kind} enqueues to come in {len(feeds)} bursts")
    return "".join(f", {part}" for part in parts)


def run(options: Options) -> int:
    say = Narrator()
    rng = random.Random(options.seed)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="miniqueue-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not become_subreaper():
        say("not on Linux: orphans go to init, so orphan lifetimes are checked less precisely")
    site = Site(workdir)
    fleet: Fleet | None = None
    feeder: Feeder | None = None
    signaller: Signaller | None = None
    sampler: Sampler | None = None
    report: list[Path] = []
    ok = False
    try:
        code = snapshot_code(REPO_ROOT, workdir)
        site.start(options, code, say)
        if not site.owned and any(s in options.scenarios for s in OWNED_ONLY):
            say("restart-postgres skipped: the harness restarts only a server it owns (omit --database-url)")
            options = dataclasses.replace(options, scenarios=tuple(s for s in options.scenarios if s not in OWNED_ONLY))
        title = _title(options, site)
        say(f"{title[0]}; logs in {workdir}")
        fleet = Fleet(site.dsn, options, workdir, code, say, shards=site.map_path)
        fleet.wait_ready(fleet.start(), timeout=60.0)
        timeline = Timeline()
        sampler = Sampler(site, timeline)
        sampler.start()
        if options.fair:
            set_rules([shard.server.dsn for shard in site.shards])
        with site.producer() as producer:
            workload = enqueue(producer, options, rng)
            say(
                f"enqueued {len(workload.ids)} jobs ({len(workload.effect_jobs)} with a transactional effect"
                f"{_extras(workload)}), available over {options.enqueue_spread:.0f}s; chaos for {options.duration:g}s"
            )
            durable_ids: list[int] = []
            sent_ahead = 0
            if options.durable:
                durable_ids, sent_ahead = enqueue_durable(producer, options.durable_jobs, options.sleep_ms)
                signaller = Signaller([shard.server.dsn for shard in site.shards])
                signaller.start()
                say(f"enqueued {len(durable_ids)} durable jobs ({sent_ahead} of their signals sent ahead)")
        injector = Injector(options, fleet, site, rng, say)
        started = time.monotonic()
        origin = time.time()
        if workload.feeds:
            feeder = Feeder(site.producer, workload, say)
            feeder.start()
        run_chaos(options, fleet, injector, rng, say)
        feeder_problem = _finish_feeding(feeder, options)
        drain_seconds, drain_error = None, None
        try:
            drain_seconds = drain(options, fleet, injector, site, say)
            say(f"drained {drain_seconds:.1f}s after the chaos ended")
        except TimeoutError as exc:
            drain_error = str(exc)
            say(f"PROBLEM: {exc}")
        if signaller is not None:
            signaller.stop()
        blocked: Blocked | None = None
        if options.sequences and drain_error is None:
            blocked = release_blocked(site, workload, fleet, injector, say)
        sampler.stop()
        fleet.stop_all()
        injector.settle()
        elapsed = time.monotonic() - started
        if options.keyed:
            found = reconcile(site, workload)
            if found:
                say(f"found {len(found)} keyed job(s) whose enqueue reply was lost: {found}")
        verdict = _judge(options, site, fleet, injector, workload, drain_seconds, drain_error, blocked, feeder_problem)
        if options.durable:
            verdict.rows += durable_rows(site, durable_ids, sent_ahead, injector.stops, verdict.data)
        title.append(f"chaos + drain {elapsed:.0f}s; run directory {workdir}")
        print(table(title, verdict), flush=True)
        if options.json_path:
            write_json(options.json_path, title, verdict, run_facts(options, injector.faults, say.t0, workdir))
        if options.report:
            timeline.load_completions(site)
            path = options.report_path or workdir / "report.md"
            report = write_report(path, title, verdict, options, injector.faults, timeline, origin)
            say(f"report: {path}")
        ok = verdict.ok
        return 0 if ok else 1
    except BaseException:
        for thread in (feeder, signaller, sampler):
            if thread is not None:
                thread.stop()
        if fleet is not None:
            fleet.kill_everything()
        raise
    finally:
        _cleanup(options, site, workdir, ok, report, say)


def _judge(
    options: Options,
    site: Site,
    fleet: Fleet,
    injector: Injector,
    workload: Workload,
    drain_seconds: float | None,
    drain_error: str | None,
    blocked: Blocked | None,
    feeder_problem: str | None,
) -> Verdict:
    survivors, zombies = fleet.leftovers()
    record = RunRecord(
        options=options,
        enqueued=workload.ids,
        effect_jobs=workload.effect_jobs,
        sleep_ms=workload.sleep_ms,
        workload=workload,
        faults=injector.faults,
        stops=injector.stops,
        process_problems=fleet.problems,
        external_stops=fleet.external_stops,
        survivors=survivors,
        zombies_left=zombies,
        orphans_adopted=fleet.tracker.reaped_orphans,
        logs="\n".join(s.output() for s in fleet.supervisors),
        drain_seconds=drain_seconds,
        drain_error=drain_error,
        blocked=blocked,
        feeder_problem=feeder_problem,
    )
    return judge(site.evidence(), record)


def _finish_feeding(feeder: Feeder | None, options: Options) -> str | None:
    """Wait for the feeder's last burst (due within the spread, so usually already sent); its
    problem, if it crashed or could not finish."""
    if feeder is None:
        return None
    if not feeder.join(timeout=options.drain_timeout):
        feeder.stop()
        return f"the feeder was still enqueueing {options.drain_timeout:g}s after the chaos ended"
    return feeder.crashed


def _title(options: Options, site: Site) -> list[str]:
    over = f"over {options.databases} databases, " if options.sharded else ""
    return [
        f"miniqueue chaos{' --everything' if options.everything else ''}: {options.jobs} jobs, {over}"
        f"{options.workers} workers x {options.concurrency} "
        f"{'async coroutine' if options.async_handlers else 'thread'}(s), "
        f"{_modes(options)}"
        f"{options.duration:g}s of chaos, a fault every {options.kill_interval[0]:g}-{options.kill_interval[1]:g}s, "
        f"seed {options.seed}",
        f"server: {site.describe()}; lease {options.lease_duration:g}s, heartbeat {options.heartbeat:g}s, reaper "
        f"{options.reaper_interval:g}s; scenarios: {','.join(options.scenarios)}",
    ]


def _modes(options: Options) -> str:
    """The title's note of ``--limits`` and ``--workflow``."""
    modes = []
    if options.limits:
        modes.append(f"limits on {options.limit_share:.0%} of the jobs")
    if options.fair:
        modes.append("fair jobs")
    if options.workflow:
        modes.append(
            f"{options.groups} groups of {options.group_size} + callback, "
            f"{options.chains} chains of {options.chain_length}"
        )
    if options.unique:
        modes.append(f"{options.unique_jobs} unique enqueues over {options.unique_keys} keys")
    if options.sequences:
        modes.append(f"{options.sequence_keys} sequence keys x {options.sequence_length}")
    if options.durable:
        modes.append(f"{options.durable_jobs} durable jobs")
    if options.batches:
        modes.append(f"{options.batch_jobs} batch jobs")
    return "".join(f"{mode}, " for mode in modes)


def run_facts(options: Options, faults: list[Fault], t0: float, workdir: Path) -> dict[str, object]:
    """What the JSON adds to the verdict: the options, every fault injected, the run directory."""
    offset = time.time() - (time.monotonic() - t0)  # epoch seconds at the run's start
    return {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(options).items()},
        "fault_log": [
            {
                "kind": f.kind,
                "at": round(f.at - offset, 3),
                "lasted": round(f.until - f.at, 3),
                "pids": f.pids,
                "leases": f.leases,
                "detail": f.detail,
            }
            for f in faults
        ],
        "run_directory": str(workdir),
    }


def _cleanup(options: Options, site: Site, workdir: Path, ok: bool, report: list[Path], say: Narrator) -> None:
    """Keep everything for a failed run (or with --keep); otherwise leave nothing behind but the
    report."""
    keep = options.keep or not ok
    site.cleanup(keep)
    if keep and site.owned:
        say(f"kept the run: logs and each server's data in {workdir} (stopped; start one with pg_ctl -D <its pgdata>)")
    elif keep:
        say(f"kept the run: logs in {workdir}, database {site.shards[0].server.database if site.shards else '-'}")
    elif options.workdir is None:
        inside = [path for path in report if path.resolve().is_relative_to(workdir.resolve())]
        if not inside:
            shutil.rmtree(workdir, ignore_errors=True)
            return
        for entry in workdir.iterdir():
            if entry not in inside:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        say(f"removed the run directory but its report: {inside[0]}")
