"""Testing your tasks: a real database per test session, your jobs run in-process, assertions.

Load the pytest fixtures with ``-p miniqueue.testing`` (or ``pytest_plugins =
["miniqueue.testing"]`` in your root ``conftest.py``): ``miniqueue_dsn`` (a migrated database
with an empty queue), ``miniqueue_client``, ``miniqueue_database`` and
``miniqueue_server_dsn``. The plugin is opt-in, not a ``pytest11`` entry point: installing
miniqueue must not add fixtures, or start servers, in test suites that did not ask for them.

The functions work without pytest too (unittest, Django's test runner): :func:`run_jobs` runs
the queued jobs through a real worker and returns a :class:`RunResult`;
:func:`assert_enqueued` and :func:`enqueued_jobs` read the stored rows; the
``*_database`` functions make and empty test databases. Given the Django integration's
``get_client()``, the assertions read on Django's connection, so inside
``django.test.TestCase`` they see the jobs the test's transaction enqueued; ``run_jobs`` needs
committed jobs (``TransactionTestCase``).
"""

from .assertions import assert_enqueued, enqueued_jobs
from .database import (
    QUEUE_TABLES,
    TEST_DATABASE_ENV,
    clean_database,
    create_database,
    drop_database,
    server_dsn,
    temporary_database,
)
from .runner import JobRun, Retries, RunResult, RunTimeout, run_jobs

# Read by pytest only when it loads this module as a plugin: the fixtures live in a module of
# their own so that importing miniqueue.testing needs no pytest.
pytest_plugins = ["miniqueue.testing.plugin"]

__all__ = [
    "QUEUE_TABLES",
    "TEST_DATABASE_ENV",
    "JobRun",
    "Retries",
    "RunResult",
    "RunTimeout",
    "assert_enqueued",
    "clean_database",
    "create_database",
    "drop_database",
    "enqueued_jobs",
    "run_jobs",
    "server_dsn",
    "temporary_database",
]
