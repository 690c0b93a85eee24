"""An order, and the receipt a job writes for it."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    number = models.IntegerField(unique=True)

    class Meta:
        app_label = "shop"


class Receipt(models.Model):
    order = models.IntegerField(unique=True)
    job_id = models.BigIntegerField()

    class Meta:
        app_label = "shop"
