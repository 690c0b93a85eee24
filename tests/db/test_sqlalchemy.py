"""miniqueue.integrations.sqlalchemy: a job enqueued in a SQLAlchemy transaction exists only if
that transaction commits (real PostgreSQL, SQLAlchemy on psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, Integer, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import miniqueue
from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection
from miniqueue.integrations.sqlalchemy import enqueue, enqueue_many, psycopg_connection
from miniqueue.testing import assert_enqueued, enqueued_jobs, run_jobs

from ..helpers import count


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sa_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)


def sqlalchemy_url(dsn: str) -> URL:
    """The test database as a postgresql+psycopg URL (a unix socket directory goes in the query)."""
    parts = {key: str(value) for key, value in conninfo_to_dict(dsn).items()}
    host = parts.get("host")
    socket = host is not None and host.startswith("/")
    return URL.create(
        "postgresql+psycopg",
        username=parts.get("user"),
        password=parts.get("password"),
        host=None if socket else host,
        port=int(parts["port"]) if "port" in parts else None,
        database=parts.get("dbname"),
        query={"host": host} if socket and host else {},
    )


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    engine = create_engine(sqlalchemy_url(dsn))
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_a_committed_session_stores_the_job_with_its_rows(engine: Engine, client: Client, conn: Connection) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(id=8))
        result = enqueue(client, session, "send_receipt", {"order": 8}, queue="mail", priority=3)
        # Not visible outside the session's transaction until it commits.
        assert count(conn) == 0
    job = assert_enqueued(client, task="send_receipt", payload={"order": 8}, queue="mail", count=1)[0]
    assert (job.id, job.priority) == (result.id, 3)
    assert conn.execute("SELECT count(*) FROM sa_orders").fetchone() == (1,)


def test_a_rolled_back_session_leaves_no_job(engine: Engine, client: Client, conn: Connection) -> None:
    with Session(engine) as session:
        session.add(Order(id=9))
        enqueue(client, session, "send_receipt", {"order": 9})
        session.rollback()
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        enqueue(client, session, "send_receipt", {"order": 10})
        raise RuntimeError("the request failed")
    assert enqueued_jobs(client) == []
    assert conn.execute("SELECT count(*) FROM sa_orders").fetchone() == (0,)


def test_a_connection_and_a_savepoint(engine: Engine, client: Client) -> None:
    with engine.connect() as connection:
        with connection.begin():
            enqueue(client, connection, "kept")
            savepoint = connection.begin_nested()
            enqueue(client, connection, "dropped")
            savepoint.rollback()
        with connection.begin():
            enqueue_many(client, connection, [JobSpec("batch", {"n": i}) for i in range(3)])
            connection.rollback()
    assert [job.task for job in enqueued_jobs(client)] == ["kept"]


def test_the_job_runs_once_committed(engine: Engine, client: Client) -> None:
    app = miniqueue.App()
    seen: list[int] = []

    @app.task("send_receipt")
    def send_receipt(job: miniqueue.Job) -> None:
        seen.append(job.payload["order"])

    with Session(engine) as session, session.begin():
        session.add(Order(id=11))
        app.enqueue(client, "send_receipt", {"order": 11}, conn=psycopg_connection(session))
    assert [job.payload for job in run_jobs(app, client).completed] == [{"order": 11}]
    assert seen == [11]


def test_autocommit_isolation_commits_at_once(engine: Engine, client: Client) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        enqueue(client, connection, "now")
        connection.execute(text("SELECT 1"))
    assert_enqueued(client, task="now", count=1)


def test_another_driver_is_refused() -> None:
    with (
        Session(create_engine("sqlite://")) as session,
        pytest.raises(miniqueue.ConfigError, match=r"sqlite\+pysqlite.*use a postgresql\+psycopg:// URL"),
    ):
        psycopg_connection(session)


def test_a_unique_key_holds_inside_the_sessions_transaction(engine: Engine, client: Client, conn: Connection) -> None:
    with Session(engine) as session, session.begin():
        first = enqueue(client, session, "send_receipt", {"order": 9}, queue="mail", unique_key="receipt:9")
        again = enqueue(client, session, "send_receipt", {"order": 9}, queue="mail", unique_key="receipt:9")
        assert (again.id, again.duplicate) == (first.id, True)
    assert count(conn) == 1
