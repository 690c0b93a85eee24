"""The project's miniqueue app: its handler writes through the ORM."""

from __future__ import annotations

from django.db import close_old_connections

import miniqueue

from .models import Receipt

app = miniqueue.App()


@app.task("send_receipt", queue="mail")
def send_receipt(job: miniqueue.Job) -> None:
    # As Django does around a request: a handler thread's connection is closed once it is too
    # old (at once with the default CONN_MAX_AGE), so none is left open by a thread that ended.
    close_old_connections()
    try:
        Receipt.objects.get_or_create(order=job.payload["order"], defaults={"job_id": job.id})
    finally:
        close_old_connections()
