"""``python -m chaos`` options."""

from __future__ import annotations

import argparse
import random
import signal
import sys
from pathlib import Path

from .options import LIMIT_KEYS, SCENARIOS, OptionError, Options, sharded_defaults


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run a real miniqueue-supervise on a real database under injected faults, then check that "
        "no job was lost or completed twice and that every re-execution was caused by a fault.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # No argparse default for these three: theirs depends on --databases (see options_from).
    p.add_argument(
        "--jobs",
        type=int,
        default=argparse.SUPPRESS,
        help="jobs to enqueue (default: 300; with --databases N, 10 per database per second of "
        "--outage-after + --outage: 450 for 3)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=argparse.SUPPRESS,
        help="worker processes per supervisor (default: 4; with --databases N, 2 per "
        "database and 2 more for the stopped one: 8 for 3)",
    )
    p.add_argument("--concurrency", type=int, default=1, help="handler threads (coroutines with --async) per worker")
    p.add_argument(
        "--async", dest="async_handlers", action="store_true", help="run the chaos task as an async def handler"
    )
    p.add_argument("--duration", type=float, default=30.0, help="seconds of chaos")
    p.add_argument(
        "--kill-interval",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=[0.5, 1.5],
        help="seconds between faults, drawn uniformly",
    )
    p.add_argument("--seed", type=int, help="random seed (default: drawn and printed)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated scenarios to inject")
    p.add_argument(
        "--database-url",
        help="a server to create the run's database on (default: an embedded "
        "server of the harness's own, in the run directory, which restart-postgres needs)",
    )
    p.add_argument("--lease", type=float, default=3.0, help="lease seconds (heartbeat: a third of it)")
    p.add_argument("--effect-share", type=float, default=0.5, help="share of jobs completing transactionally")
    p.add_argument(
        "--sleep-ms",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=argparse.SUPPRESS,
        help="handler sleep in milliseconds, drawn per job (default: 10 100; with --databases, 200 300)",
    )
    p.add_argument("--max-attempts", type=int, default=25, help="attempts per job before it goes dead")
    p.add_argument("--allow-dead", action="store_true", help="report dead jobs instead of failing on them")
    p.add_argument("--spread", type=float, help="seconds over which jobs become available (default: 0.8 x duration)")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="seconds the queue may take to drain after")
    p.add_argument("--workdir", type=Path, help="run directory for logs and the embedded server (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the run directory and database even on success")
    p.add_argument(
        "--limits",
        action="store_true",
        help=f"give a share of the jobs a concurrency key ({', '.join(f'{k} max {n}' for k, n in LIMIT_KEYS.items())}) "
        "and check that no key ever had more leases at once than its limit",
    )
    p.add_argument("--limit-share", type=float, default=0.3, help="share of the jobs with a key (with --limits)")
    p.add_argument(
        "--workflow",
        action="store_true",
        help="enqueue groups (with a then callback) and chains among the jobs, and check that every "
        "dependent ran to completion once, only after its parents completed",
    )
    p.add_argument("--groups", type=int, default=10, help="groups (with --workflow)")
    p.add_argument("--group-size", type=int, default=10, help="members per group (with --workflow)")
    p.add_argument("--chains", type=int, default=10, help="chains (with --workflow)")
    p.add_argument("--chain-length", type=int, default=5, help="steps per chain (with --workflow)")
    p.add_argument(
        "--unique",
        action="store_true",
        help="enqueue a share of the jobs with a unique key, again and again over the run (duplicates "
        "expected), and check that no two jobs of a key ever held it or ran at once",
    )
    p.add_argument(
        "--unique-share", type=float, default=0.2, help="share of the plain jobs enqueued with a key (with --unique)"
    )
    p.add_argument("--unique-keys", type=int, default=4, help="unique keys (with --unique)")
    p.add_argument(
        "--sequences",
        action="store_true",
        help="enqueue jobs with sequence keys over the run, and check that each key's jobs ran one at a "
        "time in enqueue order, and that a dead job blocks its key until it is released",
    )
    p.add_argument("--sequence-keys", type=int, default=10, help="sequence keys (with --sequences)")
    p.add_argument("--sequence-length", type=int, default=5, help="jobs per sequence key (with --sequences)")
    p.add_argument(
        "--durable",
        action="store_true",
        help="also enqueue durable jobs (5 steps, one transactional, 2 sleeps, a signal each) and check that "
        "no recorded step ran again, each transactional effect happened once, no sleep or wait spent an attempt",
    )
    p.add_argument("--durable-jobs", type=int, default=40, help="durable jobs (with --durable)")
    p.add_argument(
        "--databases",
        type=int,
        default=1,
        help="run over this many databases, each on a server of the harness's own, one shard map over them; "
        "with 2 or more, one server is stopped mid-run (the run's only fault) and the others' throughput "
        "meanwhile is checked (see chaos/README.md, 'Several databases')",
    )
    p.add_argument("--outage", type=float, default=10.0, help="seconds the stopped server stays down (--databases)")
    p.add_argument(
        "--outage-after", type=float, default=5.0, help="seconds after the enqueue the server is stopped (--databases)"
    )
    p.add_argument(
        "--kill-in-outage",
        action="store_true",
        help="also SIGKILL the stopped database's supervisor while its server is down (--databases): the process "
        "above it must start it again, and every supervisor must still drain and exit 0",
    )
    p.add_argument("--json", dest="json_path", type=Path, help="also write the result to this JSON file")
    return p


def options_from(argv: list[str] | None) -> Options:
    args = parser().parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    jobs, workers, sleep_ms = (
        sharded_defaults(args.databases, args.outage, args.outage_after) if args.databases > 1 else (300, 4, (10, 100))
    )
    given = vars(args)
    return Options(
        jobs=given.get("jobs", jobs),
        workers=given.get("workers", workers),
        concurrency=args.concurrency,
        async_handlers=args.async_handlers,
        duration=args.duration,
        kill_interval=(args.kill_interval[0], args.kill_interval[1]),
        seed=seed,
        scenarios=tuple(s.strip() for s in args.scenarios.split(",") if s.strip()),
        database_url=args.database_url,
        lease=args.lease,
        effect_share=args.effect_share,
        sleep_ms=tuple(given["sleep_ms"]) if "sleep_ms" in given else sleep_ms,
        max_attempts=args.max_attempts,
        allow_dead=args.allow_dead,
        drain_timeout=args.drain_timeout,
        spread=args.spread,
        json_path=args.json_path,
        workdir=args.workdir,
        keep=args.keep,
        limits=args.limits,
        limit_share=args.limit_share,
        workflow=args.workflow,
        groups=args.groups,
        group_size=args.group_size,
        chains=args.chains,
        chain_length=args.chain_length,
        unique=args.unique,
        unique_share=args.unique_share,
        unique_keys=args.unique_keys,
        sequences=args.sequences,
        sequence_keys=args.sequence_keys,
        sequence_length=args.sequence_length,
        durable=args.durable,
        durable_jobs=args.durable_jobs,
        databases=args.databases,
        outage=args.outage,
        outage_after=args.outage_after,
        kill_in_outage=args.kill_in_outage,
    ).validated()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    try:
        options = options_from(argv)
    except OptionError as exc:
        print(f"python -m chaos: error: {exc}", file=sys.stderr)
        return 2
    from .fleet import CrashLoop
    from .run import run
    from .sharded import run_sharded

    # TERM (and INT, even when a background shell ignores it) unwind through the run's cleanup,
    # which kills every supervisor's process group and stops the harness's own server.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)
    try:
        return run_sharded(options) if options.sharded else run(options)
    except CrashLoop as exc:
        print(f"python -m chaos: error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as exc:
        print(f"python -m chaos: interrupted ({exc}); processes stopped, run directory kept", file=sys.stderr)
        return 130
