"""The chaos schedule: a fault every MIN-MAX seconds (seeded), each requested scenario at least
once early on, weighted draws after that; then the drain, with a deadline."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from .faults import Injector
from .fleet import Fleet
from .options import STOP_DATABASE, WEIGHTS, Options
from .site import Site

TICK = 0.1

_UNFINISHED = "SELECT count(*) FROM miniqueue_jobs WHERE state IN ('available', 'running', 'waiting')"
#: With --sequences: a job waiting behind a failed or dead job that blocks its key is not
#: unfinished business for the drain; the harness checks and releases that key afterwards.
_UNFINISHED_UNBLOCKED = """
SELECT count(*) FROM miniqueue_jobs j
 WHERE j.state IN ('available', 'running', 'waiting')
   AND NOT (j.state = 'waiting' AND j.sequence_key IS NOT NULL AND EXISTS (
       SELECT 1 FROM miniqueue_sequences s JOIN miniqueue_jobs h ON h.id = s.head
        WHERE s.key = j.sequence_key AND s.on_failure = 'block' AND h.state IN ('failed', 'dead')))
"""


#: The scenarios that need servers the harness owns.
OWNED_ONLY = ("restart-postgres", STOP_DATABASE)


def first_round(options: Options, owned: bool, rng: random.Random) -> list[str]:
    """Every requested scenario once, in a seeded order; both restart modes when the server is ours."""
    must = [s for s in options.scenarios if s not in OWNED_ONLY or owned]
    if "restart-postgres" in must:
        must.append("restart-postgres")  # the first restart is fast, the second immediate
    rng.shuffle(must)
    return must


def run_chaos(
    options: Options, fleet: Fleet, injector: Injector, rng: random.Random, say: Callable[[str], None]
) -> None:
    """Inject faults for ``options.duration`` seconds."""
    owned = injector.site.owned
    pending = first_round(options, owned, rng)
    kinds = [s for s in options.scenarios if s not in OWNED_ONLY or owned]
    weights = [WEIGHTS[k] for k in kinds]
    end = time.monotonic() + options.duration
    next_at = time.monotonic() + rng.uniform(*options.kill_interval)
    while time.monotonic() < end:
        fleet.monitor()
        injector.tick()
        if "stop-worker" in pending and injector.inject("stop-worker") is not None:
            # A worker is busy only for its job's 10-100 ms: look for one every tick rather than
            # only at fault times, or a lightly loaded run may never catch one.
            pending.remove("stop-worker")
        if time.monotonic() >= next_at:
            _inject_one(injector, pending, kinds, weights, rng)
            next_at = time.monotonic() + rng.uniform(*options.kill_interval)
        time.sleep(TICK)
    injector.finish()
    if pending:
        say(f"chaos ended before these scenarios found a target: {', '.join(pending)}")


def _inject_one(
    injector: Injector, pending: list[str], kinds: list[str], weights: list[float], rng: random.Random
) -> None:
    """The next scenario of the first round (put back if it found no target), else a weighted draw
    (with a few redraws when the drawn one has no target)."""
    for kind in [k for k in pending if k != "stop-worker"][:1]:
        pending.remove(kind)
        if injector.inject(kind) is not None:
            return
        pending.append(kind)  # no target right now: try it again next time, draw another now
    for _ in range(4):
        if injector.inject(rng.choices(kinds, weights)[0]) is not None:
            return


def drain(options: Options, fleet: Fleet, injector: Injector, site: Site, say: Callable[[str], None]) -> float:
    """Wait until no job is available, running or waiting (for its parents, or its turn in a sequence
    that no dead job blocks) and no worker is frozen; return the seconds it took, or raise
    TimeoutError at the drain deadline."""
    query = _UNFINISHED_UNBLOCKED if options.sequences else _UNFINISHED
    started = time.monotonic()
    deadline = started + options.drain_timeout
    next_report = started + 10.0
    while True:
        fleet.monitor()
        injector.tick()
        unfinished = site.total(query)
        if unfinished == 0 and not injector.busy:
            return time.monotonic() - started
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(
                f"{unfinished} job(s) still available, running or waiting {options.drain_timeout:g}s "
                "after the chaos ended"
            )
        if now >= next_report:
            say(f"draining: {unfinished} job(s) left")
            next_report = now + 10.0
        time.sleep(0.2)
