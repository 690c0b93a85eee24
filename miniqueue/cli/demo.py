"""The demo app run by ``miniqueue demo``: five jobs that print a line as they are processed."""

from __future__ import annotations

import os

from ..tasks.app import App
from ..tasks.job import Job

app = App()

#: The demo's jobs, (task, priority): enqueued in this order, processed by priority then FIFO.
DEMO_JOBS = [
    ("process_payment", 10),
    ("generate_thumbnail", 5),
    ("sync_inventory", 3),
    ("send_welcome_email", 1),
    ("send_notification", 1),
]


def _report(job: Job) -> None:
    print(
        f"processed {job.task:<20} priority {job.priority:>2}  job {job.id}  attempt {job.attempt}  pid {os.getpid()}",
        flush=True,
    )


for _name, _priority in DEMO_JOBS:
    app.task(_name, queue="demo", priority=_priority)(_report)
