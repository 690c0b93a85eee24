"""The job filter of the jobs page: parsed from a query string or form, rendered back into links,
hidden fields and the client's keyword arguments."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from ..client.inspection import check_filters
from ..core.errors import InvalidInput, JobNotFound
from ..core.records import State
from ..core.validation import JOB_ID_RANGE

MAX_TEXT = 200
MAX_ID = 2**63 - 1  # job ids are BIGINT
_ID_RE = re.compile(r"[0-9]{1,19}")


def parse_id(text: str, what: str = "job id") -> int:
    """A non-negative BIGINT from a query or form field, or InvalidInput naming the value."""
    text = text.strip()
    if not _ID_RE.fullmatch(text) or int(text) > MAX_ID:
        raise InvalidInput(f"{what} {text[:40]!r} is invalid: use a whole number from 0 to {MAX_ID}")
    return int(text)


def stored_id(job_id: int) -> int:
    """``job_id`` if a job can have it, else JobNotFound: a page answers "not found" for any id
    no job has, 0 included, where the client would refuse an id below 1 as invalid input."""
    if job_id < JOB_ID_RANGE[0]:
        raise JobNotFound(job_id)
    return job_id


@dataclasses.dataclass(frozen=True)
class JobFilter:
    """What the jobs page shows: every field None matches all jobs.

    ``created_after`` / ``created_before`` bound the creation time as ``[after, before)``;
    ``search`` is a substring of the payload's JSON text.
    """

    state: State | None = None
    queue: str | None = None
    task: str | None = None
    search: str | None = None
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> JobFilter:
        """Read ``state, queue, task, q, from, to`` (blank means unset); raise InvalidInput."""
        state = _text(params, "state")
        if state is not None and state not in {s.value for s in State}:
            raise InvalidInput(f"state {state!r} is invalid: use one of {', '.join(s.value for s in State)}")
        return cls(
            state=State(state) if state else None,
            queue=_text(params, "queue"),
            task=_text(params, "task"),
            search=_text(params, "q"),
            created_after=_time(params, "from"),
            created_before=_time(params, "to"),
        )

    def client_kwargs(self) -> dict[str, Any]:
        """The filter as keyword arguments of the client's ``list_jobs`` / ``count_jobs`` / ``job_ids``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def matchable(self, before_id: int | None = None) -> bool:
        """Whether a job can match (with ``before_id``, on a later page). The client refuses a
        queue or task name that breaks the naming rules, or an id below 1, as invalid input;
        the pages show that no job matches."""
        try:
            check_filters(before_id=before_id, **self.client_kwargs())
        except InvalidInput:
            return False
        return True

    def with_state(self, state: State | None) -> JobFilter:
        return dataclasses.replace(self, state=state)

    def items(self) -> list[tuple[str, str]]:
        """The set fields as ``(parameter, value)`` pairs, for links and hidden form fields."""
        values = {
            "state": self.state.value if self.state else None,
            "queue": self.queue,
            "task": self.task,
            "q": self.search,
            "from": _format_time(self.created_after),
            "to": _format_time(self.created_before),
        }
        return [(k, v) for k, v in values.items() if v]

    def query(self, **extra: Any) -> str:
        """A query string of the filter plus ``extra`` (None values left out)."""
        return urlencode(self.items() + [(k, str(v)) for k, v in extra.items() if v is not None])

    def describe(self) -> str:
        """A short human description: ``state dead, queue emails`` or ``all jobs``."""
        names = {"q": "payload contains", "from": "created from", "to": "created before"}
        parts = [f"{names.get(k, k)} {v!r}" if k == "q" else f"{names.get(k, k)} {v}" for k, v in self.items()]
        return ", ".join(parts) or "all jobs"

    def input_value(self, name: str) -> str:
        """The value to put back in the filter form's input ``name``."""
        return dict(self.items()).get(name, "")


def _text(params: Mapping[str, Any], name: str) -> str | None:
    value = str(params.get(name) or "").strip()
    if len(value) > MAX_TEXT:
        raise InvalidInput(f"filter {name!r} is too long: use at most {MAX_TEXT} characters")
    return value or None


def _time(params: Mapping[str, Any], name: str) -> dt.datetime | None:
    """An ISO time such as ``2024-05-01T10:00`` (what a datetime-local input sends); no offset means UTC."""
    text = _text(params, name)
    if text is None:
        return None
    try:
        value = dt.datetime.fromisoformat(text.replace(" ", "T").replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"time {text!r} in filter {name!r} is invalid: use YYYY-MM-DDTHH:MM (UTC)") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _format_time(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    utc = value.astimezone(dt.timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S" if utc.second or utc.microsecond else "%Y-%m-%dT%H:%M")
