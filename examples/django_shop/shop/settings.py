"""The shop's settings: the database is ``$DATABASE_URL`` (a PostgreSQL URL or conninfo string)."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_database = {key: str(value) for key, value in conninfo_to_dict(os.environ["DATABASE_URL"]).items()}

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure: an example's key, never a real site's")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "miniqueue.integrations.django",  # `manage.py miniqueue`, and the queue's tables on `manage.py migrate`
    "orders",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # on psycopg 3, which miniqueue enqueues on
        "NAME": _database.get("dbname", ""),
        "USER": _database.get("user", ""),
        "PASSWORD": _database.get("password", ""),
        "HOST": _database.get("host", ""),
        "PORT": _database.get("port", ""),
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

# The confirmation emails are printed by the worker that sends them (Django's test runner keeps
# them in django.core.mail.outbox instead).
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "shop@example.com"

# What `manage.py miniqueue supervise` runs. The queue is on the "default" database, where
# `enqueue` writes on Django's own connection.
MINIQUEUE = {"APP": "orders.tasks:app"}
