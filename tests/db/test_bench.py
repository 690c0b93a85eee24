"""Every benchmark row runs, and the SQL floors send what the product sends.

A row that stops running stops measuring without anyone noticing until the next full run: the
SQL floor under the claim did, when the claim took new parameters. Here every row of
``bench/suite.py`` runs once at a tiny size (``python -m bench --tiny``: each row's own counts,
backlogs and windows shrink to a few; what it runs does not change), on the test server, through
the same code as the bench (a scratch database of its own, then the row). Nothing looks at a
figure: at these sizes they mean nothing, and a timing is never a test. A row passes when it ran
to the end, with its own checks (every row raises when its jobs did not all complete as it
expects), and its table line and targets render.

The floors are also checked against the product itself: the claim floor sends the statement a
real worker sends, with the same parameters, and the enqueue floor the statement and parameters
of ``Client.enqueue``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any

import pytest

from bench.apps import noop_app
from bench.claim import floor_params
from bench.claim import floor_statement as claim_floor_statement
from bench.database import QUEUE, TASK, payload
from bench.enqueue import floor_statement as enqueue_floor_statement
from bench.measure import Sample
from bench.plans import check_plans
from bench.registry import Benchmark, select
from bench.report import RowResult, render_table
from bench.suite import BENCHMARKS, TINY_JOBS, run_once
from bench.targets import cpu_ratios, evaluate, render_cpu_table, render_verdicts
from miniqueue import Client, JobSpec, State
from miniqueue.core.db import Connection
from miniqueue.core.steps import Query, _do
from miniqueue.store.store import Store
from miniqueue.worker.worker import Worker

from ..helpers import wait_until
from ..running import FAST, Running

#: Rows that need something CI does not have, each with the reason: they are the only rows not
#: run here. None today: every row runs on the test server with what ``.[dev]`` installs.
NEEDS_MORE_THAN_CI: dict[str, str] = {}

#: Rows whose work runs in the bench's own processes (spawned by bench/processes.py, or this
#: one). Every other row starts miniqueue's processes (a supervisor and its workers, or a worker
#: process), which takes longer: they are the ``test_supervised_row_runs`` group (select it, or
#: leave it out, with ``-k``).
IN_PROCESS = ("enqueue*", "floor-*", "plain-insert", "claim-*", "wait-wake")


def _in_process(benchmark: Benchmark) -> bool:
    return any(fnmatch.fnmatchcase(benchmark.name, pattern) for pattern in IN_PROCESS)


def _rows(in_process: bool) -> list[Any]:
    return [
        pytest.param(b, id=b.name)
        for b in BENCHMARKS
        if _in_process(b) == in_process and b.name not in NEEDS_MORE_THAN_CI
    ]


def test_rows_left_out_are_rows() -> None:
    names = {b.name for b in BENCHMARKS}
    assert set(NEEDS_MORE_THAN_CI) <= names, set(NEEDS_MORE_THAN_CI) - names
    assert len(names) == len(BENCHMARKS), "two rows share a name"


def test_baselines_are_rows() -> None:
    names = {b.name for b in BENCHMARKS}
    assert {base for b in BENCHMARKS for base in b.baselines} <= names


#: The rows of unique keys and sequence keys (bench/keys.py), each a ratio to a baseline.
KEYED_ROWS = ("drain-unique-2", "drain-sequences-2", "enqueue-unique")


def test_unique_and_sequence_rows_bring_their_baselines() -> None:
    """``--only`` of the keyed rows runs their baselines too, in suite order."""
    assert [b.name for b in select(BENCHMARKS, KEYED_ROWS)] == [
        "drain-2-default",
        "drain-unique-2",
        "drain-sequences-2",
        "enqueue-plain",
        "enqueue-unique",
        "enqueue-idempotent",
    ]


def test_unique_and_sequence_targets_are_ratios_to_their_baselines() -> None:
    """Each keyed row's target is set against its baseline's median (any figures will do)."""
    rows = [
        RowResult(b, [Sample(jobs=1000, seconds=1.0, p50_ms=None, p99_ms=None, rss_mb=None)])
        for b in select(BENCHMARKS, KEYED_ROWS)
    ]
    targets = {v.target for v in evaluate(rows)}
    for name, baseline, share in (
        ("drain-unique-2", "drain-2-default", "0.90x"),
        ("drain-sequences-2", "drain-2-default", "0.70x"),
        ("enqueue-unique", "enqueue-plain", "0.80x"),
    ):
        assert f"{name} / {baseline} (same run) >= {share}" in targets
    # A keyed row, however fast, never stands in for the plain drain in its best-worker-count target.
    faster = [
        RowResult(row.benchmark, [Sample(jobs=10**6, seconds=1.0, p50_ms=None, p99_ms=None, rss_mb=None)])
        if row.benchmark.name in KEYED_ROWS
        else row
        for row in rows
    ]
    assert not any(
        name in v.measured for v in evaluate(faster) if "best worker count" in v.target for name in KEYED_ROWS
    )


@pytest.mark.parametrize("benchmark", _rows(in_process=True))
def test_in_process_row_runs(server_dsn: str, benchmark: Benchmark) -> None:
    _runs(server_dsn, benchmark)


@pytest.mark.parametrize("benchmark", _rows(in_process=False))
def test_supervised_row_runs(server_dsn: str, benchmark: Benchmark) -> None:
    _runs(server_dsn, benchmark)


def _runs(server_dsn: str, benchmark: Benchmark) -> None:
    """One tiny run of the row, then what the report makes of it."""
    sample = run_once(server_dsn, benchmark, jobs=TINY_JOBS, tiny=True)
    # The row's own checks ran inside; how many jobs it reports is a figure (rate-limit-2's, the
    # jobs completed in a window, depends on how fast the machine is), and so is its time.
    assert isinstance(sample, Sample)
    row = RowResult(benchmark, [sample])
    assert benchmark.name in render_table([row])
    render_verdicts(evaluate([row]))
    if ratios := cpu_ratios([row]):
        render_cpu_table(ratios, None)


def test_plan_checks_run(server_dsn: str) -> None:
    checks = check_plans(server_dsn, tiny=True)
    assert [check.label.split(",")[0] for check in checks] == [
        "claim x100",
        "claim x100",
        "complete_many x100",
        "enqueue_many x100 with keys",
        "claim x100",
    ]
    assert all(check.plan for check in checks)


class RecordingStore(Store):
    """The store, unchanged, noting each statement it sends through ``_rows`` (the text and the
    parameters): what a real worker sends, as bench/plans.py's ExplainingStore sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def _rows(self, conn: Connection, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:  # type: ignore[override]
        self.sent.append((query, dict(params)))
        return Store._rows(conn, query, params)


@pytest.fixture
def recorded_worker(dsn: str) -> Iterator[tuple[Worker, RecordingStore]]:
    """A worker of the bench's no-op app whose store notes what it sends, running on a thread."""
    worker = Worker(noop_app, dsn, FAST)
    store = RecordingStore()
    worker.store = store
    running = Running(worker)
    yield worker, store
    running.stop()


def test_the_claim_floor_sends_what_a_worker_sends(
    client: Client, recorded_worker: tuple[Worker, RecordingStore]
) -> None:
    worker, store = recorded_worker
    ids = [client.enqueue(TASK, payload(n), queue=QUEUE).id for n in range(3)]
    wait_until(lambda: all(client.get(i).state is State.COMPLETED for i in ids), what="the jobs completed")
    # Every statement that claimed or completed a job: the claim loop sends one kind only.
    claims = [(query, params) for query, params in store.sent if "limit" in params]
    assert claims
    for query, params in claims:
        statement, claim_params = claim_floor_statement(Store(), worker.worker_id, params["limit"])
        assert query == statement
        expected = floor_params(claim_params, [])
        assert params.keys() == expected.keys()
        differ = {"lease_duration", "ids", "attempts"}  # the floor's lease is longer; the leases it completes its own
        assert {k: v for k, v in params.items() if k not in differ} == {
            k: v for k, v in expected.items() if k not in differ
        }
    assert any(params["ids"] for _, params in claims), "no completion rode with a claim"


def test_the_enqueue_floor_sends_what_client_enqueue_sends(client: Client, conn: Connection) -> None:
    # Client.enqueue's own steps (tracing off), driven on a connection request by request.
    steps = client._enqueue_steps(JobSpec(TASK, payload(0), queue=QUEUE))
    sent: list[Query] = []
    result: Any = None
    with pytest.raises(StopIteration):
        while True:
            request = steps.send(result)
            assert isinstance(request, Query), request
            sent.append(request)
            result = _do(conn, request)
    statement, params = enqueue_floor_statement(Store())
    assert sent[-1].sql == statement
    assert dict(sent[-1].params or {}) == params
