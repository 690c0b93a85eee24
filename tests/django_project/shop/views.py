"""A view-like function: an order and its receipt job, in one transaction."""

from __future__ import annotations

from django.db import transaction

from miniqueue.integrations.django import enqueue

from .models import Order


def place_order(number: int, *, fail: bool = False) -> int:
    """Create order ``number`` and enqueue its receipt; ``fail`` raises before the commit."""
    with transaction.atomic():
        Order.objects.create(number=number)
        job = enqueue("send_receipt", {"order": number}, queue="mail")
        if fail:
            raise RuntimeError("payment declined")
    return job.id
