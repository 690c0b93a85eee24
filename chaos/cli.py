"""``python -m chaos`` options."""

from __future__ import annotations

import argparse
import random
import signal
import sys
from pathlib import Path
from typing import Any

from .options import (
    ALL_SCENARIOS,
    BATCH_SIZE,
    EVERYTHING,
    FAIR_RULE,
    FAIR_RULE_LIMIT,
    FAIR_TENANTS,
    LIMIT_KEYS,
    MODES,
    SCENARIOS,
    OptionError,
    Options,
    sharded_defaults,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run a real miniqueue-supervise on a real database under injected faults, then check that "
        "no job was lost or completed twice and that every re-execution was caused by a fault.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # The options --everything sets have no argparse default (SUPPRESS): options_from tells one
    # given on the command line, which wins, from one left out.
    p.add_argument(
        "--everything",
        action="store_true",
        help="every mode at once ("
        + ", ".join(f"--{k.replace('_', '-')}" for k in EVERYTHING if k != "scenarios")
        + f"; scenarios {','.join(ALL_SCENARIOS)}): over two databases, under every fault the harness can inject "
        "there, with the report; an option given explicitly wins",
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
    p.add_argument(
        "--scenarios",
        default=argparse.SUPPRESS,
        help=f"comma-separated scenarios to inject (default: {','.join(SCENARIOS)}; {ALL_SCENARIOS[-1]} needs "
        "a full run over several databases)",
    )
    p.add_argument(
        "--database-url",
        help="a server to create the run's database on (default: an embedded "
        "server of the harness's own, in the run directory, which restart-postgres needs)",
    )
    p.add_argument("--lease-duration", type=float, default=3.0, help="lease seconds (heartbeat: a third of it)")
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
        default=argparse.SUPPRESS,
        help=f"give a share of the jobs a concurrency key ({', '.join(f'{k} max {n}' for k, n in LIMIT_KEYS.items())}) "
        "and check that no key ever had more lanes at once than its limit (a lane: the leases one claim took "
        "together, run one after another)",
    )
    p.add_argument("--limit-share", type=float, default=0.3, help="share of the jobs with a key (with --limits)")
    p.add_argument(
        "--fair",
        action="store_true",
        default=argparse.SUPPRESS,
        help=f"make every plain job fair: by its concurrency key, else by a tenant key ({', '.join(FAIR_TENANTS)}) "
        f"that the rule {FAIR_RULE!r} limits to {FAIR_RULE_LIMIT} running; check that no tenant key exceeded it",
    )
    p.add_argument(
        "--workflow",
        action="store_true",
        default=argparse.SUPPRESS,
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
        default=argparse.SUPPRESS,
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
        default=argparse.SUPPRESS,
        help="enqueue jobs with sequence keys over the run, and check that each key's jobs ran one at a "
        "time in enqueue order, and that a dead job blocks its key until it is released",
    )
    p.add_argument("--sequence-keys", type=int, default=10, help="sequence keys (with --sequences)")
    p.add_argument("--sequence-length", type=int, default=5, help="jobs per sequence key (with --sequences)")
    p.add_argument(
        "--durable",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also enqueue durable jobs (5 steps, one transactional, 2 sleeps, a signal each) and check that "
        "no recorded step ran again, each transactional effect happened once, no sleep or wait spent an attempt",
    )
    p.add_argument("--durable-jobs", type=int, default=40, help="durable jobs (with --durable)")
    p.add_argument(
        "--batches",
        action="store_true",
        default=argparse.SUPPRESS,
        help=f"enqueue a share of the plain jobs as jobs of a batch task ({BATCH_SIZE} at a time) and check that no "
        "batch was larger and that a batch's jobs interrupted by a crash ran alone next",
    )
    p.add_argument(
        "--batch-share", type=float, default=0.3, help="share of the plain jobs of the batch task (with --batches)"
    )
    p.add_argument(
        "--databases",
        type=int,
        default=argparse.SUPPRESS,
        help="run over this many databases (default: 1), each on a server of the harness's own, one shard map "
        "over them; with no mode, one server is stopped mid-run (the run's only fault) and the others' "
        "throughput meanwhile is checked; with a mode, the full run over them (see chaos/README.md)",
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
    p.add_argument(
        "--report",
        nargs="?",
        const="",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="write a Markdown report with plots (SVG files beside it) to PATH (default: <run dir>/report.md, "
        "kept when the run directory is removed); on with --everything",
    )
    return p


def options_from(argv: list[str] | None) -> Options:
    args = parser().parse_args(argv)
    given: dict[str, Any] = vars(args)
    if args.everything:
        for name, value in EVERYTHING.items():
            given.setdefault(name, value)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    scenarios = given.get("scenarios", SCENARIOS)
    if isinstance(scenarios, str):
        scenarios = tuple(s.strip() for s in scenarios.split(",") if s.strip())
    databases = int(given.get("databases", 1))
    modes = {mode: bool(given.get(mode, False)) for mode in MODES}
    outage_run = databases > 1 and not any(modes.values()) and scenarios == SCENARIOS
    jobs, workers, sleep_ms = (
        sharded_defaults(databases, args.outage, args.outage_after) if outage_run else (300, 4, (10, 100))
    )
    report = given.get("report")
    return Options(
        jobs=given.get("jobs", jobs),
        workers=given.get("workers", workers),
        concurrency=args.concurrency,
        duration=args.duration,
        kill_interval=(args.kill_interval[0], args.kill_interval[1]),
        seed=seed,
        scenarios=tuple(scenarios),
        database_url=args.database_url,
        lease_duration=args.lease_duration,
        effect_share=args.effect_share,
        sleep_ms=tuple(given["sleep_ms"]) if "sleep_ms" in given else sleep_ms,
        max_attempts=args.max_attempts,
        allow_dead=args.allow_dead,
        drain_timeout=args.drain_timeout,
        spread=args.spread,
        json_path=args.json_path,
        workdir=args.workdir,
        keep=args.keep,
        limit_share=args.limit_share,
        groups=args.groups,
        group_size=args.group_size,
        chains=args.chains,
        chain_length=args.chain_length,
        unique_share=args.unique_share,
        unique_keys=args.unique_keys,
        sequence_keys=args.sequence_keys,
        sequence_length=args.sequence_length,
        durable_jobs=args.durable_jobs,
        batch_share=args.batch_share,
        databases=databases,
        outage=args.outage,
        outage_after=args.outage_after,
        kill_in_outage=args.kill_in_outage,
        report=report is not None and report is not False,
        report_path=Path(report) if isinstance(report, str) and report else None,
        everything=args.everything,
        **modes,
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
        return run_sharded(options) if options.outage_run else run(options)
    except CrashLoop as exc:
        print(f"python -m chaos: error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as exc:
        print(f"python -m chaos: interrupted ({exc}); processes stopped, run directory kept", file=sys.stderr)
        return 130
