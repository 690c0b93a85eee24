"""The chaos harness's short forms, as CI runs them: real supervisors, real kills, real restarts.

Each test runs ``python -m chaos`` as a subprocess and trusts its verdict (exit code 0), then
checks the headline numbers from its JSON. The harness starts embedded PostgreSQL servers of its
own in a folder of its own rather than using the session's ``server_dsn``: restarting PostgreSQL
mid-run (fast, then immediate) is part of every short form, and the session's server is shared
with other tests (or, under ``TEST_DATABASE_URL``, not ours to restart at all).

The first run is ``--everything`` (every mode at once: concurrency limits, groups and chains,
unique keys, sequences with a key blocked by a dead job, durable jobs, batch handlers; over two
databases under one shard map), under every fault the harness can inject there (worker, reaper
and database-supervisor kills, a SIGSTOP past the lease, backend terminations, a fast and an
immediate restart, a second supervisor, a held snapshot, a stopped server), with its Markdown
report: it must pass, and the report must hold every invariant's line at 0. With
``MINIQUEUE_CHAOS_REPORT_DIR`` set (CI sets it), the report and its charts are copied there, with
the invariant lines in ``summary.txt``. It asserts all that the two runs it replaced asserted:
``--limits --workflow`` with ``def`` handlers, and ``--unique --sequences --durable``.

A second run has the chaos task as an ``async def`` handler (``--async``, 4 coroutines per worker,
so a kill lands on several at once) with ``--limits --workflow``, on one database (20 s of chaos:
every scenario is still injected, each one once early on).

The rules of the modes are also shown to catch what they are meant to catch, on records built by
hand: leases of one key held at once, and lanes (the leases one claim took past its room are one),
a dependent claimed before its parent completed, two runs of one key at once (allowed only past a
lost lease), a re-claimed lease its live worker forgot and
a retry put off past the backoff of its charged attempts (two faults the run once found, fixed
since); and the keyed SQL on rows made by hand
in a database of the session's server (an overlap, two holders of a unique key, a sequence job
released, claimed and run before its turn).

A third run is ``--databases 3`` alone, the outage run (three embedded servers, one shard map,
``miniqueue-supervise --shards``): one server is stopped 5 s after the enqueue and started again
10 s later; the other two databases' throughput meanwhile must hold (at least 0.8x of before) and
every job of all three completes exactly once. Quick tests show that a database fault explains
lost attempts on its own database only, and that the supervisors' log rules catch a claim loop
that retries without waiting and a database's supervisor that exits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from chaos import schema
from chaos.check_batches import batch_rows
from chaos.check_leases import forgotten_rows, retry_rows
from chaos.check_limits import lanes, peak
from chaos.check_unique import judge_overlaps
from chaos.check_workflow import workflow_rows
from chaos.evidence import Attempt, Evidence, Execution
from chaos.faults import Fault
from chaos.keyed import Holding, KeyedEvidence, Overlap, Run
from chaos.options import ALL_SCENARIOS, BATCH_SIZE, FAIR_RULE_LIMIT, FAIR_TENANTS, LIMIT_KEYS
from chaos.report import INVARIANTS
from chaos.server import Harness
from chaos.supervisors import SupervisorLog, supervisor_rows
from chaos.verify import explain, lost_attempt_causes
from chaos.workload import CHAIN_STEP, Workload
from miniqueue.core.db import connect
from miniqueue.core.shard_map import ID_BASE, MODULUS
from miniqueue.testing import database as testing_db

EVERYTHING_FORM = ["--everything", "--jobs", "300", "--workers", "4", "--duration", "30", "--seed", "1"]
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
DATABASES_FORM = ["--databases", "3", "--seed", "1"]
SCENARIOS = (
    "kill-worker",
    "kill-reaper",
    "stop-worker",
    "terminate-backend",
    "kill-supervisor",
    "two-supervisors",
    "pin-horizon",
)
#: Where CI keeps the everything run's report (an artifact), when set.
REPORT_DIR_ENV = "MINIQUEUE_CHAOS_REPORT_DIR"


def _run_chaos(form: list[str], tmp_path: Path, repo_root: Path, timeout: float = 120) -> dict[str, Any]:
    """Run ``python -m chaos`` with ``form``; assert it passed and return its JSON result."""
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
            timeout=timeout,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert run.returncode == 0, f"chaos run failed:\n{run.stdout}\n--- stderr (tail)\n{run.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(result_file.read_text())
    return result


def _assert_every_fault_injected(faults: dict[str, int], scenarios: tuple[str, ...] = SCENARIOS) -> None:
    for scenario in scenarios:
        assert faults.get(scenario, 0) >= 1, f"{scenario} was never injected: {faults}"
    assert faults.get("restart-postgres", 0) >= 2, f"expected a fast and an immediate restart: {faults}"


def _assert_limits_and_workflow(result: dict[str, Any]) -> None:
    # --limits: no key ever had more lanes at once than its max_concurrent (on its task and database).
    assert result["limit_exceeded"] == []
    assert set(result["limits"]) == set(LIMIT_KEYS)
    for key, seen in result["limits"].items():
        assert 1 <= seen["max_overlap"] <= seen["max_concurrent"] == LIMIT_KEYS[key], (key, seen)
    # --workflow: every callback and step released once, after its parents, and completed once.
    workflow = result["workflow"]
    assert (workflow["groups"], workflow["chains"], workflow["dependents"]) == (10, 10, 50)
    for broken in ("lost", "not_completed_once", "release_problems", "claimed_before_parents", "wrong_parent_results"):
        assert workflow[broken] == [], (broken, workflow[broken])


def _table_lines(report: Path, section: str) -> dict[str, str]:
    """A two-column table of the report (the invariants): each line's name and count."""
    lines = report.read_text().split(f"## {section}", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [line.strip("| ").split(" | ") for line in lines if line.startswith("| ") and "---" not in line]
    return {name: count for name, count in rows[1:]}


def _keep_report(report: Path) -> None:
    """With MINIQUEUE_CHAOS_REPORT_DIR set: the report and its charts there, and in ``summary.txt``
    (what CI prints) the invariant lines."""
    target = os.environ.get(REPORT_DIR_ENV)
    if not target or not report.exists():
        return
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    for path in report.parent.glob(f"{report.stem}*"):
        shutil.copy2(path, folder / path.name)
    summary = ["chaos --everything (CI short form): invariants, each must be 0"]
    summary += [f"  {name}: {count}" for name, count in _table_lines(report, "Invariants").items()]
    (folder / "summary.txt").write_text("\n".join(summary) + "\n")


@pytest.mark.timeout(200)
def test_everything_at_once_under_every_fault_loses_nothing_and_reports_every_invariant_at_0(
    tmp_path: Path, repo_root: Path
) -> None:
    report = tmp_path / "report" / "report.md"
    try:
        result = _run_chaos([*EVERYTHING_FORM, "--report", str(report)], tmp_path, repo_root, timeout=175)
    finally:
        _keep_report(report)  # for CI, passed or not
    options = result["options"]
    assert options["everything"] and options["databases"] == 2 and options["async_handlers"] is False
    for mode in ("limits", "workflow", "unique", "sequences", "durable", "batches", "fair"):
        assert options[mode], mode
    # Every job stored completed exactly once, but the one planned to die (it blocked its key).
    blocked = result["blocked"]
    assert result["planned_dead"] == [blocked["job"]]
    assert result["completed"] == result["enqueued"] - 1
    for broken in (
        "lost",
        "dead",
        "completed_more_than_once",
        "duplicated_effects",
        "effect_mismatches",
        "executed_twice",
        "odd_transitions",
        "repeated_fences",
        "unexplained",
        "forgotten_leases",
        "late_retries",
        "late_completions",
        "process_problems",
        "zombies_left",
        "orphans_left",
    ):
        assert result[broken] == [], (broken, result[broken])
    # Every fault the harness can inject over two databases, each at least once.
    _assert_every_fault_injected(result["faults"], ALL_SCENARIOS)
    assert any(stop["taken_over"] for stop in result["stops"]), f"no SIGSTOP outlived its lease: {result['stops']}"
    _assert_limits_and_workflow(result)
    # --durable: 40 jobs of five steps (one transactional), two sleeps and a signal each, judged
    # apart (their sleeps and waits end leases by design): each completed once, each effect once,
    # no recorded step ran again, no step recorded by a stale attempt, no attempt spent by a sleep.
    assert (result["durable_jobs"], result["durable_completed"]) == (40, 40)
    for broken in (
        "durable_replayed_steps",
        "durable_effect_problems",
        "durable_stale_steps",
        "durable_spent_attempts",
    ):
        assert result[broken] == [], (broken, result[broken])
    # --unique: 18 enqueues of 4 keys over the run (a fifth of the 90 jobs outside the workflow and
    # the sequences); no two jobs of a key held it or ran at once.
    unique = result["unique"]
    assert unique["enqueues"] == 18
    # Stored: the 72 plain jobs (22 of the batch task), the 160 of the workflow, the 50 sequence
    # jobs, and each unique key's jobs (not its duplicates).
    assert result["enqueued"] == 72 + 160 + 50 + unique["stored"]
    assert unique["duplicates"] >= 1 and unique["stored"] >= 4, unique
    assert unique["stored"] + unique["duplicates"] >= 18  # a lost reply's retry may store one more
    for broken in ("failed_enqueues", "wrong_duplicates", "not_completed_once", "held_at_once", "overlaps"):
        assert unique[broken] == [], (broken, unique[broken])
    # --sequences: 10 keys x 5 jobs, each key one job at a time, in enqueue order.
    sequences = result["sequences"]
    assert (sequences["keys"], sequences["jobs"]) == (10, 50)
    for broken in (
        "failed_enqueues",
        "misnumbered",
        "not_completed_once",
        "release_problems",
        "early",
        "out_of_order",
        "overlaps",
    ):
        assert sequences[broken] == [], (broken, sequences[broken])
    # The dead job blocked its key's later jobs (waiting, never claimed) until its release.
    assert blocked["key"] == "seq-9" and blocked["state"] == "dead", blocked
    assert blocked["behind"] and set(blocked["behind"].values()) == {"waiting"}, blocked
    assert blocked["problems"] == [] and blocked["completed_after"] is not None, blocked
    # --batches: the batch task's jobs ran in calls of at most BATCH_SIZE, and each one a crash
    # interrupted beside others ran alone next.
    batches = result["batches"]
    assert batches["jobs"] == 22 and batches["calls"] >= 1, batches
    assert max(int(size) for size in batches["sizes"]) <= BATCH_SIZE, batches
    assert batches["oversize"] == [] and batches["not_alone_next"] == [], batches
    # --fair: every plain job took turns by key; no tenant key had more lanes at once than its rule.
    assert result["fair_limit_exceeded"] == [] and set(result["fair"]) == set(FAIR_TENANTS), result["fair"]
    for seen in result["fair"].values():
        assert seen["most_lanes_at_once"] <= seen["limit"] == FAIR_RULE_LIMIT, seen
    # The report: every invariant's line, each at 0.
    assert report.exists() and report.with_name("report-throughput.svg").exists()
    assert report.with_name("report-recovery.svg").read_text().startswith("<svg")
    invariants = _table_lines(report, "Invariants")
    assert set(invariants) == {i.name for i in INVARIANTS}, invariants
    assert set(invariants.values()) == {"0"}, invariants
    # Two faults the run once found, fixed since: each is an invariant line of its own.
    assert invariants["re-claimed leases forgotten by a live worker"] == "0"
    assert invariants["charged retries put off past their backoff"] == "0"
    assert "## Known faults" not in report.read_text()


@pytest.mark.timeout(150)
def test_short_chaos_run_with_async_handlers_loses_nothing_and_completes_nothing_twice(
    tmp_path: Path, repo_root: Path
) -> None:
    result = _run_chaos(ASYNC_FORM, tmp_path, repo_root)
    assert result["options"]["async_handlers"] is True
    assert result["enqueued"] == 300
    assert result["completed"] == 300
    assert result["lost"] == []
    assert result["completed_more_than_once"] == []
    assert result["duplicated_effects"] == []
    assert result["effect_mismatches"] == []
    assert result["unexplained"] == []
    assert result["process_problems"] == []
    _assert_every_fault_injected(result["faults"])
    assert any(stop["taken_over"] for stop in result["stops"]), f"no SIGSTOP outlived its lease: {result['stops']}"
    _assert_limits_and_workflow(result)


@pytest.mark.timeout(120)
def test_a_database_stopped_for_10_s_leaves_the_others_running_and_loses_nothing(
    tmp_path: Path, repo_root: Path
) -> None:
    # Three databases of 150 jobs each (handlers sleep 200-300 ms, so the other two still have
    # jobs waiting when the outage ends); db0 (weight 2: 4 of the 8 workers) is stopped.
    result = _run_chaos(DATABASES_FORM, tmp_path, repo_root)
    outage = result["outage"]
    assert outage["down_seconds"] >= 10.0, outage
    assert outage["ratio"] >= 0.8, f"the others' throughput fell while {outage['database']} was down: {outage}"
    assert all(min(counts) > 0 for counts in outage["backlog"].values()), "a database ran out of jobs"
    assert outage["first_completion_after_start"] is not None, "the stopped database never completed a job again"
    assert result["faults"] == {"stop-database": 1}
    assert (result["enqueued"], result["completed"], result["lost"]) == (450, 450, [])
    for name, database in result["databases"].items():
        assert database["enqueued"] == database["completed_once"] == 150, (name, database)
    for broken in ("completed_more_than_once", "duplicated_effects", "effect_mismatches", "unexplained"):
        assert result[broken] == [], (broken, result[broken])
    assert result["process_problems"] == []
    supervisors = result["supervisors"]
    assert supervisors["exits"] == [] and supervisors["child_exits"] == [] and supervisors["early_retries"] == []


def test_a_database_fault_explains_lost_attempts_on_its_own_database_only() -> None:
    on_db1, on_db2 = ID_BASE + 1, ID_BASE + 2  # ids carry their database's index modulo MODULUS
    assert (on_db1 % MODULUS, on_db2 % MODULUS) == (1, 2)
    stop = Fault("stop-database", 10.0, 20.0, database=1)
    lost = "worker lost: vm:500:w stopped renewing its lease"
    assert explain(Attempt(on_db1, 1, "vm:500:w", 9.0, 21.0, "available", lost), [stop]) == "stop-database"
    assert explain(Attempt(on_db2, 1, "vm:501:w", 9.0, 21.0, "available", lost), [stop]) is None


def test_the_supervisor_log_rules_catch_a_claim_loop_that_does_not_wait_and_a_supervisor_exit() -> None:
    def line(second: float, who: str, logger: str, message: str) -> str:
        return f"2026-01-01 10:00:{second:06.3f}".replace(".", ",") + f" [{who}] INFO {logger}: {message}"

    log = [
        line(
            0.0, "supervisor 10", "miniqueue.supervisor", "started the supervisor of database db0 (pid 11, 1 workers)"
        ),
        line(
            0.0, "supervisor 10", "miniqueue.supervisor", "started the supervisor of database db1 (pid 12, 1 workers)"
        ),
        line(0.1, "supervisor 11", "miniqueue.supervisor", "spawned worker-1 (pid 21)"),
        line(0.1, "supervisor 12", "miniqueue.supervisor", "spawned worker-1 (pid 22)"),
        # db0's worker backs off as it says; db1's says 5 s and retries every 10 ms.
        *[
            line(
                1 + 0.1 * 2**n,
                "worker-1 21",
                "miniqueue.worker",
                f"w: database unavailable; retrying in {0.1 * 2**n:.1f}s",
            )
            for n in range(5)
        ],
        *[
            line(1 + 0.01 * n, "worker-1 22", "miniqueue.worker", "w: database unavailable; retrying in 5.0s")
            for n in range(20)
        ],
        line(
            5.0,
            "supervisor 10",
            "miniqueue.supervisor",
            "the supervisor of database db1 (pid 12) exited with 1: starting it again",
        ),
    ]
    parsed = SupervisorLog.parse("\n".join(log))
    assert parsed.owner == {11: "db0", 12: "db1", 21: "db0", 22: "db1"}
    rows = {row.label.strip(): row for row in supervisor_rows(parsed, "db0", up=0.0, kill=None, data={})}
    assert [o.split(":")[0] for o in rows["workers retrying sooner than their back-off (over 5 times)"].offenders] == [
        "pid 22"
    ]
    exits = rows["a database's supervisor exited, not killed by the harness"].offenders
    assert len(exits) == 1 and exits[0].startswith("db1: pid 12 exited with 1"), exits


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


def _claimed(job: int, claimed: float, ended: float | None, xact: int, worker: str = "host:100:w") -> Attempt:
    return Attempt(job, 1, worker, claimed, ended, None if ended is None else "completed", claim_xact=xact)


def test_the_limits_rule_counts_the_leases_one_claim_took_together_under_a_limit_of_1_as_one_lane() -> None:
    # Limit 1: job 1 holds the slot until 5.0; then one claim (transaction 7) takes jobs 2, 3 and 4
    # together: one lane, held until job 4 ends at 9.0.
    held = [_claimed(1, 0.0, 5.0, 1, "host:101:w")]
    together = [_claimed(2, 6.0, 7.0, 7), _claimed(3, 6.0, 8.0, 7), _claimed(4, 6.0, 9.0, 7)]
    found = lanes([*held, *together], 1)
    assert [[x.job for x in lane.leases] for lane in found] == [[1], [2, 3, 4]]
    assert (found[1].claimed, found[1].ended) == (6.0, 9.0)
    assert peak(found, 1).count == 1 and peak([*held, *together], 1).count == 3
    # Job 5 claimed at 8.5 by another claim while the lane still runs: two lanes at once, over.
    over = peak(lanes([*held, *together, _claimed(5, 8.5, 10.0, 8)], 1), 1)
    assert over.count == 2 and [len(lane.leases) for lane in over.holders] == [3, 1]
    # The same three taken together under a limit of 2 are three lanes: only a limit of 1 takes
    # jobs together, so a claim past a larger limit's room shows as an overrun.
    assert peak(lanes(together, 2), 2).count == 3
    # Other workers' or transactions' leases, and leases recorded without a transaction, are lanes
    # of their own.
    apart = [_claimed(2, 6.0, 7.0, 7), _claimed(3, 6.0, 7.0, 7, "host:102:w"), _claimed(4, 6.0, 7.0, 8)]
    assert len(lanes([*held, *apart], 1)) == 4
    assert len(lanes([_lease(1, 0.0, 1.0), _lease(2, 0.0, 1.0)], 1)) == 2


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


def test_the_batch_rules_catch_an_oversize_call_and_a_batch_mate_that_did_not_run_alone_next() -> None:
    workload = Workload()
    ev = Evidence()
    # One call of BATCH_SIZE + 1 jobs.
    big = list(range(1, BATCH_SIZE + 2))
    ev.executions += [Execution(job, 1, 100, 1.0, None, "big") for job in big]
    # Job 20 ran beside job 21 when their worker was killed: both back uncharged, to run alone
    # next; job 21 did, job 20 ran next in a call of two.
    died = (
        "interrupted after 0.3s: worker process died: SIGKILL (pid 101) while 2 jobs ran in the process; "
        "attempt not charged: it runs alone next, so that a death is charged to the job that causes it"
    )
    for job in (20, 21):
        ev.by_job[job].append(Attempt(job, 1, "host:101:w", 0.0, 1.0, "available", died))
    ev.executions += [Execution(20, 1, 101, 0.5, None, "pair"), Execution(21, 1, 101, 0.5, None, "pair")]
    ev.executions += [Execution(20, 2, 102, 2.0, None, "second"), Execution(22, 1, 102, 2.0, None, "second")]
    ev.executions.append(Execution(21, 2, 103, 2.0, None, "alone"))
    workload.batch_jobs.update([*big, 20, 21, 22])
    data: dict[str, Any] = {}
    rows = {row.label.strip(): row for row in batch_rows(ev, workload, data)}
    assert len(rows[f"calls given more than {BATCH_SIZE} jobs"].offenders) == 1
    assert rows["of those, next run not alone (a batch of one)"].offenders == [
        "job 20: interrupted at attempt 1, ran next (attempt 2, pid 102) in a batch of 2"
    ]
    assert data["batches"]["interrupted_beside_others"] == 2


def test_a_lease_its_live_worker_forgot_is_unexplained_and_named_by_its_own_story() -> None:
    worker = "host:300:w"
    handed = Attempt(1, 1, worker, 0.0, 0.5, "available", "handed back unstarted: every handler thread ...")
    forgot = Attempt(1, 2, worker, 0.53, 3.6, "available", "worker lost: lease expired without renewal")
    busy = [Attempt(job, 1, worker, 1.8, 2.0, "completed") for job in (2, 3)]  # the worker went on working

    def judged(*leases: Attempt) -> tuple[str, list[str], bool | None]:
        ev = Evidence()
        for lease in leases:
            ev.leases.append(lease)
            ev.by_job[lease.job].append(lease)
        causes, _ = lost_attempt_causes(ev, [], set())
        data: dict[str, Any] = {}
        (row,) = forgotten_rows(ev, causes, 1.0, data)
        assert row.offenders == data["forgotten_leases"]
        cause = next(c for (job, attempt, _pid), c in causes.items() if (job, attempt) == (1, 2))
        return cause, data["forgotten_leases"], row.ok

    # No fault explains it: it fails the run twice, unexplained and as that story.
    assert judged(handed, forgot, *busy) == ("UNEXPLAINED", ["job 1 attempt 2 (pid 300)"], False)
    # The same expiry under a worker that did nothing more (dead or frozen, and no fault says so) ...
    assert judged(handed, forgot) == ("UNEXPLAINED", [], True)
    # ... or claimed long after the hand-back, or after another worker's lease: not that story.
    late = Attempt(1, 2, worker, 2.0, 5.0, "available", "worker lost: lease expired without renewal")
    assert judged(handed, late, *busy) == ("UNEXPLAINED", [], True)
    other = Attempt(1, 1, "host:301:w", 0.0, 0.5, "available", "handed back unstarted: every handler thread ...")
    assert judged(other, forgot, *busy) == ("UNEXPLAINED", [], True)


def test_the_retry_rule_judges_a_delay_by_the_attempts_charged_not_the_run() -> None:
    worker = "host:400:w"
    failed = "RuntimeError: boom"
    ev = Evidence()
    # Run 6 of job 1, its first charged attempt (five runs handed back before it): at most 2 s.
    ev.leases.append(Attempt(1, 6, worker, 0.0, 1.0, "available", failed, due=2.9, charged=1))
    # The same, due 3 s later: past its backoff (attempt 6's would allow it).
    ev.leases.append(Attempt(2, 6, worker, 0.0, 1.0, "available", failed, due=4.0, charged=1))
    # Three attempts charged: up to 4 s (the chaos cap), with the clock slack.
    ev.leases.append(Attempt(3, 3, worker, 0.0, 1.0, "available", failed, due=5.2, charged=3))
    # Handed back, or not charged: not a charged retry, however late.
    ev.leases.append(Attempt(4, 1, worker, 0.0, 1.0, "available", "handed back unstarted: ...", due=60.0, charged=0))
    ev.leases.append(Attempt(5, 1, worker, 0.0, 1.0, "available", "... attempt not charged", due=60.0, charged=0))
    data: dict[str, Any] = {}
    retries, late = retry_rows(ev, data)
    assert retries.value == "3"
    assert late.ok is False and late.offenders == data["late_retries"]
    assert [entry.split(",")[0] for entry in late.offenders] == ["job 2 run 6"]


def test_the_keyed_rules_allow_an_overlap_only_past_a_lost_lease() -> None:
    ev = Evidence()
    first, second = Run(1, 1, 101, 1.0, 6.0), Run(2, 1, 102, 4.0, 5.0)
    ev.keyed = KeyedEvidence(overlaps=[Overlap("unique", "unique-0", first, second)])
    # Job 1's lease ended by completion: two jobs of the key ran at once.
    ev.by_job[1].append(_lease(1, 0.5, 6.5))
    ev.by_job[2].append(_lease(2, 3.5, 5.5))
    bad, allowed = judge_overlaps(ev, "unique", {})
    assert len(bad) == 1 and not allowed
    # Job 1's lease was lost to a SIGSTOP before job 2 was claimed: a stale attempt, allowed.
    ev.by_job[1][0] = Attempt(1, 1, "host:101:w", 0.5, 3.0, "available", "worker lost")
    bad, allowed = judge_overlaps(ev, "unique", {(1, 1, 101): "stop-worker"})
    assert not bad and len(allowed) == 1
    # ... but not when no fault explains the loss, nor when job 2 was claimed before it.
    assert judge_overlaps(ev, "unique", {(1, 1, 101): "UNEXPLAINED"})[0]
    ev.by_job[2][0] = _lease(2, 2.5, 5.5)
    assert judge_overlaps(ev, "unique", {(1, 1, 101): "stop-worker"})[0]


def test_the_keyed_sql_finds_overlaps_two_holders_and_a_sequence_out_of_turn(server_dsn: str) -> None:
    dsn = testing_db.create_database(server_dsn, prefix="chaos_keyed")
    try:
        with connect(dsn, purpose="test") as conn:
            schema.install(conn)
            # Unique key u: job 2 was stored (at 3) while job 1 held the key (1-5); a second run of
            # job 2 (4-4.5) overlapped job 1's (1.1-4.9).
            keyed: list[tuple[int, str | None, str | None, float]] = [(1, "u", None, 1.0), (2, "u", None, 3.0)]
            keyed.append((3, "u", None, 7.0))
            keyed += [(10, None, "s", 1.0), (11, None, "s", 1.0), (12, None, "s", 1.0)]
            for job, unique, sequence, at in keyed:
                conn.execute(
                    "INSERT INTO chaos_keyed VALUES (%s, %s, %s, to_timestamp(%s))", (job, unique, sequence, at)
                )
            # (job, attempt, from, to, pid, at, transaction)
            transitions = [
                (1, 1, "available", "running", 101, 1.0, 1),
                (1, 1, "running", "completed", 101, 5.0, 2),
                (2, 1, "available", "running", 102, 5.5, 3),
                (2, 1, "running", "completed", 102, 6.0, 4),
                (3, 1, "available", "running", 103, 7.1, 5),
                (3, 1, "running", "completed", 103, 7.5, 6),
                # Sequence s: 11 is released in the transaction that completes 10 (stamped first,
                # as a nested statement's change is), fine; 12 is released, claimed and run
                # before 11 completed.
                (10, 0, "waiting", "available", None, 1.0, 10),
                (10, 1, "available", "running", 110, 1.1, 11),
                (10, 1, "running", "completed", 110, 2.0, 12),
                (11, 0, "waiting", "available", None, 1.99, 12),
                (11, 1, "available", "running", 111, 2.1, 13),
                (11, 1, "running", "completed", 111, 3.0, 14),
                (12, 0, "waiting", "available", None, 2.5, 15),
                (12, 1, "available", "running", 112, 2.6, 16),
                (12, 1, "running", "completed", 112, 3.5, 17),
            ]
            for job, attempt, before, after, pid, at, xact in transitions:
                conn.execute(
                    "INSERT INTO chaos_transitions (job_id, attempt, from_state, to_state, worker, at, xact) "
                    "VALUES (%s, %s, %s, %s, %s, to_timestamp(%s), %s)",
                    (job, attempt, before, after, None if pid is None else f"host:{pid}:w", at, xact),
                )
            executions = [(1, 1, 101, 1.1, 4.9), (2, 1, 102, 5.6, 5.9), (2, 0, 102, 4.0, 4.5), (3, 1, 103, 7.2, None)]
            executions += [(10, 1, 110, 1.2, 1.9), (11, 1, 111, 2.2, 2.9), (12, 1, 112, 2.7, 3.4)]
            for job, attempt, pid, at, ended in executions:
                conn.execute(
                    "INSERT INTO chaos_executions (token, job_id, attempt, pid, at, ended) "
                    "VALUES (%s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s))",
                    (f"{job}/{attempt}/{at}", job, attempt, pid, at, ended),
                )
        db = Harness(dsn)
        try:
            found = KeyedEvidence.load(db, 0.0)
        finally:
            db.close()
    finally:
        testing_db.drop_database(server_dsn, dsn)
    assert found.unique == {1: "u", 2: "u", 3: "u"} and found.sequence == {10: "s", 11: "s", 12: "s"}
    assert found.held_at_once == [(Holding("u", 1, 1.0, 5.0), Holding("u", 2, 3.0, 6.0))]
    overlaps = {(o.kind, o.first.job, o.second.job) for o in found.overlaps}
    assert overlaps == {("unique", 1, 2), ("sequence", 11, 12)}
    assert [(x.previous, x.job) for x in found.out_of_order] == [(11, 12)]
    assert [(x.previous, x.job) for x in found.early] == [(11, 12)]
    # Job 3 recorded no end: its run lasts until its lease ended.
    assert found.stored[3] == 7.0 and found.finished[3] == 7.5
