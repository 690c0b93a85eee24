"""The sequence rules (``--sequences``): the jobs of each sequence key ran one at a time, in
enqueue order (their ids), each completed exactly once; and a dead job blocked its key.

From SQL over the harness's tables (see :mod:`chaos.keyed`): no job was released from
``waiting`` or claimed before the previous job of its key finished; each completed job's
completing run (the execution of the attempt and process that completed it) started after the
previous completed job's completing run started and after that job completed; no two runs of one
key overlapped, but a stale attempt past the lease it lost (the rule of
:func:`chaos.check_unique.judge_overlaps`).

The last key's second job fails every time: it must end ``dead`` and block its key. Once the
run was quiet the harness found the key's later jobs still waiting (never claimed), the key in
``client.blocked_sequences()`` with that job, then called ``client.release_sequence(key)`` and
waited for the rest of the key to complete (:func:`chaos.feeder.release_blocked`); the order
rules above cover those jobs too.
"""

from __future__ import annotations

import collections
from typing import Any

from .check_unique import Causes, clock, judge_overlaps, leases_cut
from .evidence import Evidence
from .faults import Fault
from .feeder import Blocked
from .keyed import Early, OutOfOrder
from .rows import Row, info, rule
from .workload import Workload


def sequence_rows(
    ev: Evidence,
    workload: Workload,
    causes: Causes,
    faults: list[Fault],
    blocked: Blocked | None,
    data: dict[str, Any],
) -> list[Row]:
    """The rows of the sequence rules, after lines saying what was enqueued; then the blocked key's."""
    keyed = ev.keyed
    jobs = sorted(keyed.sequence)
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    for job in jobs:
        by_key[keyed.sequence[job]].append(job)
    enqueues = [e for e in workload.enqueues if e.kind == "sequence"]
    feeds = [f for f in workload.feeds if f.kind == "sequence"]
    failed = [f"{e.key} #{e.n} ({e.method}, {e.retries} retries): {e.error}" for e in enqueues if e.error]
    misnumbered = [f"{key}: enqueued as {ids}" for key, ids in workload.sequence_order.items() if ids != sorted(ids)]
    not_once = [
        f"job {job} ({keyed.sequence[job]}): {ev.states.get(job, ('missing', 0))[0]}, "
        f"completed {len(ev.completions.get(job, []))} times"
        for job in jobs
        if job not in workload.failing and len(ev.completions.get(job, [])) != 1
    ]
    released = [
        f"job {job} ({keyed.sequence[job]}): left waiting {len(ways)} times ({', '.join(ways) or 'never'})"
        for job in jobs
        if (ways := [state for state, _ in ev.releases.get(job, [])]) != ["available"]
    ]
    early = [_early(x) for x in keyed.early]
    disorder = [_out_of_order(x) for x in keyed.out_of_order]
    overlaps, stale = judge_overlaps(ev, "sequence", causes)
    cut, leases, frozen = leases_cut(ev, set(jobs), causes, faults)
    methods = collections.Counter(f.method for f in feeds)
    data["sequences"] = {
        "keys": len(by_key),
        "jobs": len(jobs),
        "bursts": len(feeds),
        "by_method": dict(methods),
        "failed_enqueues": failed,
        "misnumbered": misnumbered,
        "not_completed_once": not_once,
        "release_problems": released,
        "early": early,
        "out_of_order": disorder,
        "overlaps": overlaps,
        "stale_overlaps": stale,
        "leases_cut": cut,
        "held_by_a_frozen_worker": frozen,
    }
    lengths = sorted({len(ids) for ids in by_key.values()})
    shape = f"{lengths[0]}" if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}" if lengths else "-"
    return [
        info("sequences: keys, jobs per key", f"{len(by_key)} keys x {shape} jobs, in {len(feeds)} bursts"),
        info("  bursts by way of", ", ".join(f"{m} {methods[m]}" for m in sorted(methods)) or "-"),
        rule("  enqueues that failed", failed),
        rule("  keys whose jobs' ids are not in the order they were enqueued", misnumbered),
        rule("  jobs not completed exactly once (but the one planned to die)", not_once),
        rule("  jobs not released exactly once (waiting -> available)", released),
        rule("  jobs released or claimed before the previous job of their key finished", early),
        rule("  completing runs not in enqueue order (each after the previous completion)", disorder),
        rule("  executions of one key overlapping (not a stale attempt)", overlaps),
        info("  overlaps of a stale attempt past its lost lease (allowed)", len(stale)),
        info(
            "  their leases ended without completion (fault, planned failure, hand-back)",
            f"{cut} of {leases}; {frozen} held by a frozen worker",
        ),
        *blocked_rows(ev, workload, blocked, data),
    ]


def blocked_rows(ev: Evidence, workload: Workload, blocked: Blocked | None, data: dict[str, Any]) -> list[Row]:
    """The blocked key: its planned job died and blocked it, the harness saw it so, released it,
    and the rest of the key completed."""
    if blocked is None:
        data["blocked"] = None
        return [rule("sequences: the blocked key checked once the run was quiet", ["skipped: the run did not drain"])]
    key, job = blocked.key, blocked.job
    behind = sorted(blocked.behind)
    completions = len(ev.completions.get(job, [])) if job is not None else 0
    died = (
        []
        if blocked.state == "dead" and completions == 0
        else [f"job {job}: {blocked.state}, {completions} completions"]
    )
    if job is None:
        died = [blocked.error or "never enqueued"]
    waiting = [f"job {j}: {state}" for j, state in blocked.behind.items() if state != "waiting"]
    waiting += [f"job {j}: claimed while the key was blocked" for j in blocked.claimed_behind]
    if job is not None and not behind:
        waiting.append("no job waited behind it")
    expected = (key, job, "dead", len(behind))
    named = [entry for entry in blocked.listed if entry[0] == key]
    named_bad = [] if named == [expected] else [f"listed {named or 'nothing'} for {key}, expected {expected}"]
    others = [f"{k}: job {j} ({state}), {n} waiting" for k, j, state, n in blocked.listed if k != key]
    after: list[str] = []
    if blocked.error:
        after.append(blocked.error)
    if blocked.released is not None and blocked.released[0] != job:
        after.append(f"release_sequence returned {blocked.released}, expected job {job} as the blocking one")
    if blocked.listed_after:
        after.append(f"{key} still listed as blocked after its release")
    done = "-" if blocked.completed_after is None else f"in {blocked.completed_after:.1f}s ({len(behind)} jobs)"
    data["blocked"] = {
        "key": key,
        "job": job,
        "state": blocked.state,
        "behind": {str(j): s for j, s in blocked.behind.items()},
        "claimed_behind": blocked.claimed_behind,
        "listed": blocked.listed,
        "released": blocked.released,
        "completed_after": blocked.completed_after,
        "problems": died + waiting + named_bad + others + after,
    }
    return [
        Row(
            f"sequences: {key}'s job {job} (planned to fail) ended dead",
            str(blocked.state),
            "must be dead",
            not died,
            died,
        ),
        rule(f"  its {len(behind)} later jobs not waiting, or claimed, while it blocked them", waiting),
        Row(
            "  client.blocked_sequences() named it (dead, with its waiting jobs)",
            "yes" if not named_bad else "no",
            "must name it",
            not named_bad,
            named_bad,
        ),
        rule("  other sequence keys blocked", others),
        Row(
            "  client.release_sequence(key): the rest of the key completed",
            done,
            "must complete",
            not after and blocked.completed_after is not None,
            after,
        ),
    ]


def _early(x: Early) -> str:
    return (
        f"{x.key}: job {x.job} released {clock(x.released)}, claimed {clock(x.claimed)}; "
        f"the previous job {x.previous} finished {clock(x.previous_finished)}"
    )


def _out_of_order(x: OutOfOrder) -> str:
    return (
        f"{x.key}: job {x.job}'s completing run started {clock(x.started)} (completed {clock(x.completed)}); "
        f"the previous job {x.previous}'s started {clock(x.previous_started)}, completed {clock(x.previous_completed)}"
    )
