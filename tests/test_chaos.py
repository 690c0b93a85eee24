"""The chaos harness's short form, as CI runs it: a real supervisor, real kills, a real restart.

It runs ``python -m chaos`` as a subprocess and trusts its verdict (exit code 0), then checks the
headline numbers from its JSON. The harness starts an embedded PostgreSQL of its own in this
test's temporary folder rather than using the session's ``server_dsn``: restarting PostgreSQL
mid-run (fast, then immediate) is part of the short form, and the session's server is shared
with other tests (or, under ``TEST_DATABASE_URL``, not ours to restart at all). The short form
runs with ``--limits`` and ``--workflow``: a share of its jobs carry concurrency keys, and 160 of
its 300 jobs form groups and chains.

It runs twice: with the chaos task as a ``def`` handler, and as an ``async def`` one (``--async``,
4 coroutines per worker, so a kill lands on several at once). The async run is shorter (20 s of
chaos): every scenario is still injected, each one once early on, and the suite stays near its
minute and a half.

The rules of the two modes are also shown to catch what they are meant to catch, on records
built by hand: leases of one key held at once, and a dependent claimed before its parent completed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from chaos.check_limits import peak
from chaos.check_workflow import workflow_rows
from chaos.evidence import Attempt, Evidence, Execution
from chaos.options import LIMIT_KEYS
from chaos.workload import CHAIN_STEP, Workload

SHORT_FORM = [
    "--jobs",
    "300",
    "--workers",
    "4",
    "--duration",
    "30",
    "--kill-interval",
    "0.5",
    "1.5",
    "--seed",
    "1",
    "--limits",
    "--workflow",
]
ASYNC_FORM = [
    "--jobs",
    "300",
    "--workers",
    "4",
    "--duration",
    "20",
    "--kill-interval",
    "0.5",
    "1.5",
    "--seed",
    "1",
    "--limits",
    "--workflow",
    "--async",
    "--concurrency",
    "4",
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("form", [SHORT_FORM, ASYNC_FORM], ids=["def", "async-def"])
def test_short_chaos_run_loses_nothing_and_completes_nothing_twice(
    form: list[str], tmp_path: Path, repo_root: Path
) -> None:
    result_file = tmp_path / "chaos.json"
    # The run's embedded server keeps its data in a folder of its own, outside pytest's shared
    # temporary folder: another pytest on the machine may reset that folder's permissions, and
    # the server (running as its own user) would lose its data directory mid-run.
    workdir = Path(tempfile.mkdtemp(prefix="miniqueue-chaos-test-"))
    try:
        run = subprocess.run(
            [sys.executable, "-m", "chaos", *form, "--workdir", str(workdir / "run"), "--json", str(result_file)],
            cwd=repo_root,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert run.returncode == 0, f"chaos run failed:\n{run.stdout}\n--- stderr (tail)\n{run.stderr[-6000:]}"
    result = json.loads(result_file.read_text())
    assert result["options"]["async_handlers"] is ("--async" in form)
    assert result["enqueued"] == 300
    assert result["completed"] == 300
    assert result["lost"] == []
    assert result["completed_more_than_once"] == []
    assert result["duplicated_effects"] == []
    assert result["effect_mismatches"] == []
    assert result["unexplained"] == []
    assert result["process_problems"] == []
    faults = result["faults"]
    for scenario in (
        "kill-worker",
        "kill-reaper",
        "stop-worker",
        "terminate-backend",
        "kill-supervisor",
        "two-supervisors",
    ):
        assert faults.get(scenario, 0) >= 1, f"{scenario} was never injected: {faults}"
    assert faults.get("restart-postgres", 0) >= 2, f"expected a fast and an immediate restart: {faults}"
    assert any(stop["taken_over"] for stop in result["stops"]), f"no SIGSTOP outlived its lease: {result['stops']}"
    # --limits: no key ever had more leases at once than its max_concurrent.
    assert result["limit_exceeded"] == []
    assert set(result["limits"]) == set(LIMIT_KEYS)
    for key, seen in result["limits"].items():
        assert 1 <= seen["max_overlap"] <= seen["max_concurrent"] == LIMIT_KEYS[key], (key, seen)
    # --workflow: every callback and step released once, after its parents, and completed once.
    workflow = result["workflow"]
    assert (workflow["groups"], workflow["chains"], workflow["dependents"]) == (10, 10, 50)
    for broken in ("lost", "not_completed_once", "release_problems", "claimed_before_parents", "wrong_parent_results"):
        assert workflow[broken] == [], (broken, workflow[broken])


def _lease(job: int, claimed: float, ended: float | None, attempt: int = 1) -> Attempt:
    return Attempt(job, attempt, f"host:{100 + job}:w", claimed, ended, None if ended is None else "completed")


def test_the_limits_rule_counts_leases_held_at_once() -> None:
    # A lease claimed when another ends (the same stamp) does not overlap it.
    assert peak([_lease(1, 0.0, 1.0), _lease(2, 1.0, 2.0)], 1).count == 1
    # A killed worker's lease holds its slot until it is released, however short its handler.
    found = peak([_lease(1, 0.0, 5.0), _lease(2, 1.0, 2.0), _lease(3, 3.0, None)], 1)
    assert found.count == 2
    assert [x.job for x in found.holders] == [1, 2]
    assert found.seconds_at_limit == 5.0  # from 0 s on, to the last record (lease 3 never ended)


def test_the_workflow_rules_catch_an_early_claim_and_a_wrong_parent_result() -> None:
    workload = Workload()
    workload.depends(2, [1], CHAIN_STEP)
    workload.chains.append([1, 2])
    ev = Evidence()
    ev.states.update({1: ("completed", 1), 2: ("completed", 1)})
    parent, child = _lease(1, 0.0, 2.0), _lease(2, 1.0, 3.0)  # claimed before its parent completed
    for lease in (parent, child):
        ev.by_job[lease.job].append(lease)
        ev.completions[lease.job].append(lease)
    ev.releases[2].append(("available", 2.0))
    ev.executions.append(Execution(2, 1, 102, 1.5, {"1": {"attempt": 2}}))  # read another attempt's result
    data: dict[str, object] = {}
    rows = {row.label.strip(): row for row in workflow_rows(ev, workload, data)}
    assert rows["dependents claimed before all their parents completed"].offenders == [
        "job 2 (chain step): claimed 1.000s before parent 1 completed"
    ]
    assert len(rows["dependents that read a parent result other than its completion's"].offenders) == 1
    assert rows["dependents not completed exactly once"].ok
    assert rows["dependents not released exactly once (waiting -> available)"].ok
