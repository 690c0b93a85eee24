"""The workflow rules (``--workflow``): every dependent (a group's callback, a chain's step after
the first) was released once, claimed only after all its parents completed, completed exactly
once, and read its parents' results as the attempts that completed them wrote them.

All from the database's records: ``chaos_transitions`` gives each parent's completion, each
dependent's release (``waiting`` to ``available``) and each of its claims; ``chaos_executions``
what each run of a dependent read as ``job.parent_results``. A claim can only take a job whose
release committed, and the release commits with the last parent's completion, so each claim's
stamp must come after every parent's completion stamp. Every dependent completes through
``job.transaction()``, so the effect rows also show that none completed twice.
"""

from __future__ import annotations

import collections
from typing import Any

from .evidence import Evidence
from .rows import Row, info, rule
from .workload import Workload


def workflow_rows(ev: Evidence, workload: Workload, data: dict[str, Any]) -> list[Row]:
    """The rows of the workflow rules, after a line saying what was enqueued."""
    dependents = sorted(workload.parents)
    not_once = [
        _label(workload, j) + f": completed {len(ev.completions.get(j, []))} times"
        for j in dependents
        if len(ev.completions.get(j, [])) != 1
    ]
    released = _release_problems(ev, workload)
    early = _early_claims(ev, workload)
    reads = _wrong_reads(ev, workload)
    lost = [
        f"{j} ({ev.states.get(j, ('missing', 0))[0]})"
        for j in _workflow_jobs(workload)
        if ev.states.get(j, ("missing", 0))[0] != "completed"
    ]
    runs = collections.Counter(e.job for e in ev.executions if e.job in workload.parents)
    cut = collections.Counter(
        "dependents" if job in workload.parents else "parents"
        for job in _workflow_jobs(workload)
        for lease in ev.by_job.get(job, [])
        if lease.end_state != "completed"
    )
    data["workflow"] = {
        "groups": len(workload.groups),
        "chains": len(workload.chains),
        "dependents": len(dependents),
        "dependent_executions": sum(runs.values()),
        "leases_cut": dict(cut),
        "not_completed_once": not_once,
        "release_problems": released,
        "claimed_before_parents": early,
        "wrong_parent_results": reads,
        "lost": lost,
    }
    shape = ", ".join(
        f"{n} {what}"
        for n, what in (
            (len(workload.groups), f"groups of {_sizes(m for m, _ in workload.groups)} + callback"),
            (len(workload.chains), f"chains of {_sizes(workload.chains)}"),
        )
        if n
    )
    return [
        info("workflow: groups and chains enqueued", shape or "none"),
        info("  dependents (callbacks and later chain steps)", f"{len(dependents)}, {sum(runs.values())} executions"),
        info(
            "  workflow leases ended without completion (fault or hand-back)",
            f"{cut['parents']} of members and first steps, {cut['dependents']} of dependents",
        ),
        rule("  workflow jobs not completed (lost, dead or cancelled)", lost),
        rule("  dependents not completed exactly once", not_once),
        rule("  dependents not released exactly once (waiting -> available)", released),
        rule("  dependents claimed before all their parents completed", early),
        rule("  dependents that read a parent result other than its completion's", reads),
    ]


def _workflow_jobs(workload: Workload) -> list[int]:
    """Every job of a group or a chain."""
    jobs = [j for members, then in workload.groups for j in (*members, then)]
    return jobs + [j for chain in workload.chains for j in chain]


def _release_problems(ev: Evidence, workload: Workload) -> list[str]:
    """Dependents whose way out of ``waiting`` was not exactly one release to ``available``."""
    problems = []
    for job in sorted(workload.parents):
        ways = ev.releases.get(job, [])
        if [state for state, _ in ways] != ["available"]:
            shown = ", ".join(state for state, _ in ways) or "never"
            problems.append(f"{_label(workload, job)}: left waiting {len(ways)} times ({shown})")
    return problems


def _early_claims(ev: Evidence, workload: Workload) -> list[str]:
    """Dependents claimed before (or with no record of) a parent's completion."""
    early = []
    for job, parents in sorted(workload.parents.items()):
        leases = ev.by_job.get(job, [])
        if not leases:
            continue  # never claimed: reported as lost
        first = leases[0].claimed
        for parent in parents:
            done = [c.ended for c in ev.completions.get(parent, []) if c.ended is not None]
            if not done:
                early.append(f"{_label(workload, job)}: claimed, but parent {parent} never completed")
            elif first <= max(done):
                early.append(
                    f"{_label(workload, job)}: claimed {max(done) - first:.3f}s before parent {parent} completed"
                )
    return early


def _wrong_reads(ev: Evidence, workload: Workload) -> list[str]:
    """Runs of a dependent whose ``job.parent_results`` missed a parent, or held a result other
    than the one its completing attempt stored (``{"attempt": n}``)."""
    wrong = []
    for execution in ev.executions:
        parents = workload.parents.get(execution.job)
        if parents is None:
            continue
        seen = execution.parents or {}
        for parent in parents:
            done = ev.completing_attempt(parent)
            expected = {"attempt": done.attempt} if done is not None else None
            if seen.get(str(parent)) != expected or set(seen) != {str(p) for p in parents}:
                wrong.append(
                    f"{_label(workload, execution.job)} attempt {execution.attempt}: read {seen}, "
                    f"parent {parent} completed as {expected}"
                )
                break
    return wrong


def _label(workload: Workload, job: int) -> str:
    return f"job {job} ({workload.roles.get(job, 'job')})"


def _sizes(collection: Any) -> str:
    """'10', or '4-6' when the sizes differ."""
    sizes = sorted({len(x) for x in collection})
    return "-" if not sizes else str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
