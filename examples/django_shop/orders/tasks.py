"""The shop's miniqueue app (``MINIQUEUE["APP"]``): the job that confirms an order, by email,
and records it on the order through the ORM."""

from __future__ import annotations

from django.core.mail import send_mail
from django.db import close_old_connections
from django.utils import timezone

import miniqueue

from .models import Order

app = miniqueue.App()


@app.task("send_confirmation", queue="emails")
def send_confirmation(job: miniqueue.Job) -> None:
    # A handler runs on a worker's thread: as Django does around a request, close the thread's
    # connection once it is too old (at once, with the default CONN_MAX_AGE), at the start and
    # at the end, so that no thread leaves one open.
    close_old_connections()
    try:
        order = Order.objects.select_related("product").get(pk=job.payload["order"])
        if order.confirmed_at is not None:  # an earlier attempt got this far (delivery is at least once)
            return
        send_mail(
            f"Your order {order.pk}",
            f"{order.quantity} x {order.product.sku}: on its way.",
            None,  # from settings.DEFAULT_FROM_EMAIL
            [order.email],
        )
        Order.objects.filter(pk=order.pk).update(confirmed_at=timezone.now())
    finally:
        close_old_connections()
