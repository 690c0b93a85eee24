"""The project's miniqueue app: its handler writes through the ORM."""

from __future__ import annotations

from django.db import close_old_connections

import miniqueue

from .models import Receipt

app = miniqueue.App()


@app.task("send_receipt", queue="mail")
def send_receipt(job: miniqueue.Job) -> None:
    close_old_connections()  # a handler thread's Django connection, as a request would treat it
    Receipt.objects.get_or_create(order=job.payload["order"], defaults={"job_id": job.id})
