"""The clients' side of priority aging (see "Priority aging" in docs/guides/fairness.md): a
queue's interval, checked before anything is stored, as :class:`~miniqueue.Client` and
:class:`~miniqueue.AsyncClient` both set it."""

from __future__ import annotations

from ..core.steps import Steps, atomic
from ..core.validation import check_age_after, check_queue_name
from .base import BaseClient


def age_queue_steps(client: BaseClient, name: str, age_after: float | None, create: bool) -> Steps[None]:
    """Set the aging interval of queue ``name`` (None: off); a queue not known yet only with ``create``."""
    queue = check_queue_name(name)
    seconds = None if age_after is None else check_age_after(age_after)
    return atomic(_age_queue_in_one(client, queue, seconds, create))


def _age_queue_in_one(client: BaseClient, queue: str, seconds: float | None, create: bool) -> Steps[None]:
    if not create:
        yield from client._check_known_queues([queue])
    yield from client.store.set_queue_aging_steps(queue, seconds)
