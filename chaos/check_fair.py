"""The fair-share rule (``--fair``): the jobs take turns by key, and no key that a rule limits
ever had more lanes at once than the rule's limit.

With ``--fair`` every plain job is fair: a job with a concurrency key (``--limits``) takes turns
by that key, and the others by one of FAIR_TENANTS, keys that only the rule FAIR_RULE limits (at
FAIR_RULE_LIMIT running, over every task, on each database), one of them weighted by a rule too.
The rule's limit is a lease like any concurrency slot (see chaos.check_limits), judged the same
way: from the claim to the transition that ended it, per database, counting lanes (the leases one
claim took together when a key of limit 1 was free are one lane, run one after another).
"""

from __future__ import annotations

from typing import Any

from miniqueue import Client
from miniqueue.core.shard_map import MODULUS

from .check_limits import lanes, peak
from .evidence import Attempt, Evidence
from .options import FAIR_RULE, FAIR_RULE_LIMIT, FAIR_TENANTS, FAIR_WEIGHTED
from .rows import Row, info, rule
from .workload import Workload


def set_rules(dsns: list[str]) -> None:
    """The run's key rules, on every database (each enforces its own)."""
    for dsn in dsns:
        with Client(dsn) as client:
            client.set_key_rule(FAIR_RULE, limit=FAIR_RULE_LIMIT)
            client.set_key_rule(FAIR_WEIGHTED[0], weight=FAIR_WEIGHTED[1])


def fair_rows(ev: Evidence, workload: Workload, data: dict[str, Any], per_database: bool = False) -> list[Row]:
    """A row per tenant key: the most lanes at once (on any one database, ``per_database``),
    which must not exceed the rule's limit, with the most leases at once beside it."""
    rows = [info("fair: jobs taking turns by a tenant key", f"{len(workload.tenants)} over {len(FAIR_TENANTS)} keys")]
    report: dict[str, dict[str, Any]] = {}
    exceeded: list[str] = []
    for key in FAIR_TENANTS:
        scopes: dict[str, list[Attempt]] = {}
        for job in sorted(job for job, named in workload.tenants.items() if named == key):
            scope = f"db{job % MODULUS}" if per_database else "all"
            scopes.setdefault(scope, []).extend(ev.by_job.get(job, []))
        most = max((peak(lanes(x, FAIR_RULE_LIMIT), FAIR_RULE_LIMIT).count for x in scopes.values()), default=0)
        leases = max((peak(x, FAIR_RULE_LIMIT).count for x in scopes.values()), default=0)
        report[key] = {"most_lanes_at_once": most, "most_leases_at_once": leases, "limit": FAIR_RULE_LIMIT}
        if most > FAIR_RULE_LIMIT:
            exceeded.append(f"{key}: {most} lanes at once (rule {FAIR_RULE!r}: at most {FAIR_RULE_LIMIT})")
        rows.append(
            info(
                f"  {key} (rule {FAIR_RULE!r}, at most {FAIR_RULE_LIMIT}): most lanes at once",
                f"{most} (most leases at once {leases})",
            )
        )
    rows.append(rule("fair: a tenant key had more lanes at once than its rule allows", exceeded))
    data.update(fair=report, fair_limit_exceeded=exceeded)
    return rows
