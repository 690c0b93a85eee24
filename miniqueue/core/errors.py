"""One exception hierarchy for everything miniqueue raises.

Every error a caller can act on derives from :class:`MiniqueueError`. Messages name the bad
value and the rule it broke, and never contain a password.
"""

from __future__ import annotations

from collections.abc import Mapping


class MiniqueueError(Exception):
    """Base class of every error raised by miniqueue."""


class ConfigError(MiniqueueError):
    """A setting is missing, malformed or inconsistent (e.g. heartbeat not below the lease)."""


class InvalidInput(MiniqueueError, ValueError):
    """A value passed to the API breaks a rule; nothing was stored.

    ``arguments`` names each keyword argument the message tells the caller to pass, with the value
    it writes (``{"create": "True"}`` for a message that says ``create=True``), so that a surface
    with words of its own (the command line's options) can say them in those.
    """

    def __init__(self, message: str, *, arguments: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.arguments = dict(arguments or {})


class DatabaseUnavailable(MiniqueueError):
    """The database could not be reached or dropped the connection (retryable)."""


class SchemaOutOfDate(MiniqueueError):
    """The database schema is missing or older than this version of miniqueue."""


class JobNotFound(MiniqueueError, LookupError):
    """No job has the given id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class InvalidTransition(MiniqueueError):
    """The job is not in a state that allows the requested operation."""


class LeaseLost(MiniqueueError):
    """A fenced transition matched no row: the worker no longer holds the job's lease.

    The handler's outcome is discarded; whoever holds the lease now (or the reaper) decides
    what happens to the job.
    """

    def __init__(self, job_id: int, worker_id: str, attempt: int) -> None:
        super().__init__(
            f"lease lost on job {job_id} (attempt {attempt}, worker {worker_id}): it was recovered, "
            "cancelled or claimed again; this outcome is discarded"
        )
        self.job_id = job_id
        self.worker_id = worker_id
        self.attempt = attempt


class AppLoadError(MiniqueueError):
    """A ``module:attribute`` app reference could not be loaded."""


class ResultUnavailable(MiniqueueError):
    """A job has no result to give: see the subclasses for why."""

    def __init__(self, message: str, job_id: int, state: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.state = state


class JobNotFinished(ResultUnavailable):
    """The job has not finished yet (it is waiting, available or running)."""

    def __init__(self, job_id: int, state: str) -> None:
        super().__init__(f"job {job_id} has not finished: it is {state}", job_id, state)


class JobFailed(ResultUnavailable):
    """The job ended without completing (failed, dead or cancelled); ``error`` says why."""

    def __init__(self, job_id: int, state: str, error: str | None) -> None:
        last = (error or "no error recorded").strip().rsplit("\n", 1)[-1]
        super().__init__(f"job {job_id} ended {state}, so it has no result: {last}", job_id, state)
        self.error = error


class WaitTimeout(MiniqueueError, TimeoutError):
    """:meth:`~miniqueue.Client.wait` gave up: the job had not finished within the timeout."""

    def __init__(self, job_id: int, timeout: float, state: str) -> None:
        super().__init__(f"job {job_id} did not finish within {timeout:g}s: it is still {state}")
        self.job_id = job_id
        self.timeout = timeout
        self.state = state


# Named as users import them (``miniqueue.InvalidInput``), in tracebacks and in a trace's
# ``error.type``, wherever this module lives.
for _error in (
    MiniqueueError,
    ConfigError,
    InvalidInput,
    DatabaseUnavailable,
    SchemaOutOfDate,
    JobNotFound,
    InvalidTransition,
    LeaseLost,
    AppLoadError,
    ResultUnavailable,
    JobNotFinished,
    JobFailed,
    WaitTimeout,
):
    _error.__module__ = "miniqueue"
