"""Settings of the test project: its database is the test session's ($DJANGO_TEST_DSN)."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_parts = {key: str(value) for key, value in conninfo_to_dict(os.environ["DJANGO_TEST_DSN"]).items()}

SECRET_KEY = "miniqueue-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
INSTALLED_APPS = ["miniqueue.integrations.django", "tests.django_project.shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _parts.get("dbname", ""),
        "USER": _parts.get("user", ""),
        "PASSWORD": _parts.get("password", ""),
        "HOST": _parts.get("host", ""),
        "PORT": _parts.get("port", ""),
    }
}
MINIQUEUE = {"APP": "tests.django_project.shop.tasks:app"}
# Set by tests/db/test_django.py to check that a router's allow_migrate keeps miniqueue's tables off.
if os.environ.get("DJANGO_TEST_NO_QUEUE_MIGRATE"):
    DATABASE_ROUTERS = ["tests.django_project.shop.routers.NoQueueMigrations"]
