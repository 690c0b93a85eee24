"""The client's inspection calls (what the dashboard reads through it), on a real PostgreSQL:
the store's answers, on the caller's connection when given, with the client's checks first."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import psycopg
import pytest

from miniqueue import AsyncClient, Client, InvalidInput, State
from miniqueue.core.db import Connection
from miniqueue.core.records import ProcessInfo
from miniqueue.store.store import Store

from ..helpers import count, row
from .test_async_client import own_connection, using

WORKER = "web-7:4242:abc123"


class Recording:
    """A pool stand-in that records whether a connection was asked for (none may be, for bad input)."""

    def __init__(self) -> None:
        self.asked = 0

    def getconn(self) -> Any:
        self.asked += 1
        raise AssertionError("a connection was borrowed")


def failed_job(client: Client, store: Store, conn: Connection, queue: str = "emails") -> int:
    job_id = client.enqueue("send_email", queue=queue, max_attempts=1).id
    [lease] = store.claim(conn, [queue], WORKER, 30, 1)
    store.fail(conn, lease.id, WORKER, lease.attempt, "boom")
    return job_id


def test_inspection_reads_give_the_store_s_answers(client: Client, store: Store, conn: Connection) -> None:
    failed = failed_job(client, store, conn)
    waiting = [client.enqueue("send_email", {"n": n}, queue="emails").id for n in range(3)]
    other = client.enqueue("build_report", queue="reports").id
    now = store.now(conn)
    store.register_processes(
        conn,
        "web-7:4200",
        "web-7",
        [
            ProcessInfo(id="web-7:4200", kind="supervisor", pid=4200, title="miniqueue-supervise", started_at=now),
        ],
    )

    assert client.throughput() == store.throughput(conn) and [s for _, s, _ in client.throughput()] == [State.FAILED]
    assert client.processes() == store.processes(conn) and [p.pid for p in client.processes()] == [4200]
    assert client.job_states([failed, waiting[0], 10**12]) == {failed: State.FAILED, waiting[0]: State.AVAILABLE}
    assert client.count_jobs(queue="emails") == 4 and client.count_jobs(queue="emails", state=State.FAILED) == 1
    assert client.count_jobs(task="build_report") == 1 and client.count_jobs(search='"n": 2') == 1
    assert client.job_ids(queue="emails", state="available") == waiting  # oldest first
    assert client.job_ids(limit=2) == [failed, waiting[0]]
    assert client.job_ids(queue="nobody") == [] and other not in client.job_ids(queue="emails")


def test_count_and_ids_refuse_a_filter_no_job_can_match_before_borrowing() -> None:
    pool = Recording()
    client = Client(pool)  # type: ignore[arg-type]  # only asked for connections, which it refuses
    refused: list[dict[str, Any]] = [{"queue": "Bad Name"}, {"task": "no spaces allowed"}, {"search": "\udcff"}]
    for filters in refused:
        with pytest.raises(InvalidInput):
            client.count_jobs(**filters)
        with pytest.raises(InvalidInput):
            client.job_ids(**filters)
    with pytest.raises(InvalidInput, match="job id 0 is invalid"):
        client.delete([0])
    assert pool.asked == 0


def test_reads_on_your_connection_see_your_open_transaction(dsn: str, client: Client, store: Store) -> None:
    with psycopg.connect(dsn, autocommit=True) as own, own.transaction(force_rollback=True):
        job_id = client.enqueue("send_email", queue="emails", conn=own).id
        client.pause_queues(["emails"], conn=own)
        client.disable_schedule("nightly", create=True, conn=own)
        assert client.get(job_id, conn=own).id == job_id
        assert client.job_states([job_id], conn=own) == {job_id: State.AVAILABLE}
        assert client.count_jobs(conn=own) == 1 and client.job_ids(conn=own) == [job_id]
        assert client.paused_queues(conn=own) == ["emails"] and client.paused_queues() == []
        assert client.periodic_state(conn=own)["nightly"][1] is False and client.periodic_state() == {}
        assert client.now(conn=own) == client.now(conn=own)  # one transaction: one clock
        assert [q.queue for q in client.queue_stats(conn=own)] == ["emails"] and client.queue_stats() == []
    assert client.count_jobs() == 0


def test_queue_stats_without_the_served_check(client: Client, store: Store, conn: Connection) -> None:
    client.enqueue("send_email", queue="emails")
    client.enqueue("build_report", queue="reports")
    store.publish_tasks(conn, [], ["reports"])  # what a worker serving "reports" records as it starts
    assert {q.queue: q.served for q in client.queue_stats()} == {"emails": False, "reports": True}
    unchecked = client.queue_stats(check_served=False)
    assert [(q.queue, q.counts) for q in unchecked] == [(q.queue, q.counts) for q in store.queue_stats(conn)]
    assert all(q.served for q in unchecked)


def test_delete_leaves_running_jobs_and_returns_the_ids_deleted(client: Client, store: Store, conn: Connection) -> None:
    failed = failed_job(client, store, conn)
    running = client.enqueue("send_email", queue="emails").id
    store.claim(conn, ["emails"], WORKER, 30, 1)
    waiting = client.enqueue("send_email", queue="emails").id
    assert client.delete([waiting, running, failed, 10**12]) == sorted([failed, waiting])
    assert count(conn) == 1 and row(conn, running)["state"] == "running"


def test_schedules_switched_with_create_need_not_be_known(client: Client) -> None:
    with pytest.raises(InvalidInput, match="schedule 'nightly' is unknown"):
        client.disable_schedule("nightly")
    assert client.periodic_state() == {}
    client.disable_schedule("nightly", create=True)
    assert client.periodic_state()["nightly"][1] is False
    client.enable_schedule("nightly")  # known now
    assert client.periodic_state()["nightly"][1] is True
    with pytest.raises(InvalidInput, match="schedule name"):
        client.enable_schedule("no spaces", create=True)


def test_async_client_reads_on_your_connection(dsn: str, client: Client) -> None:
    async def main(a: AsyncClient) -> list[Any]:
        own = await own_connection(dsn)
        try:
            async with own.transaction(force_rollback=True):
                job_id = (await a.enqueue("send_email", queue="emails", conn=own)).id
                await a.pause_queues(["emails"], conn=own)
                await a.enable_schedule("nightly", create=True, conn=own)
                return [
                    (await a.get(job_id, conn=own)).id == job_id,
                    await a.paused_queues(conn=own),
                    await a.paused_queues(),
                    [q.served for q in await a.queue_stats(conn=own)],
                    [q.served for q in await a.queue_stats(check_served=False, conn=own)],
                    (await a.periodic_state(conn=own))["nightly"][1],
                    await a.queue_limits(conn=own),
                    await a.limit_waits(conn=own),
                    await a.now(conn=own) == await a.now(conn=own),
                ]
        finally:
            await own.close()

    assert using(dsn, main) == [True, ["emails"], [], [False], [True], True, {}, [], True]
    assert client.paused_queues() == [] and client.periodic_state() == {}


#: What the command line may import of the store: the migrator (``miniqueue.run_migrations``),
#: which makes the schema a client needs before one can open.
CLI_FROM_THE_STORE = ("miniqueue.store.migrate.",)
#: The private-looking names of a record that are its public API (NamedTuple's).
RECORD_METHODS = {"_asdict", "_replace", "_fields"}


def imported(path: Path, package: list[str]) -> list[str]:
    """The modules and names ``path`` imports, by their full dotted names."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def reaches_past_the_client(path: Path) -> list[str]:
    """Where ``path`` holds a store or reaches into another object's internals (a client's
    ``_run`` of the store's steps): a ``.store`` or ``Store``, or a private name not its own."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            private = node.attr.startswith("_") and not node.attr.startswith("__") and node.attr not in RECORD_METHODS
            if node.attr == "store" or (private and not own):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Name) and node.id == "Store":
            found.append(f"{path.name}:{node.lineno}: Store")
    return found


@pytest.mark.parametrize("layer", ["web", "cli"])
def test_the_dashboard_and_the_command_line_reach_the_database_through_the_client_alone(
    repo_root: Path, layer: str
) -> None:
    """The dashboard and the command line read and act through the client's methods only: they
    import nothing of the store (the command line: its migrator alone), hold no store, and run
    no client's steps, so a change to the store is never one to them."""
    allowed = CLI_FROM_THE_STORE if layer == "cli" else ()
    found = []
    for path in sorted((repo_root / "miniqueue" / layer).rglob("*.py")):
        package = ["miniqueue", *path.relative_to(repo_root / "miniqueue").parent.parts]
        stored = [name for name in imported(path, package) if (name + ".").startswith("miniqueue.store.")]
        found += [f"{path.name}: imports {name}" for name in stored if not name.startswith(allowed)]
        found += reaches_past_the_client(path)
    assert found == []
