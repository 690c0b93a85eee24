"""The Django app that carries ``manage.py miniqueue``."""

from __future__ import annotations

from django.apps import AppConfig


class MiniqueueConfig(AppConfig):
    name = "miniqueue.integrations.django"
    label = "miniqueue"
    verbose_name = "miniqueue"
