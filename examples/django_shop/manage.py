"""The shop's manage.py: run it from this folder (``python manage.py migrate``, ``runserver``,
``miniqueue supervise``, ``test orders``), with ``DATABASE_URL`` set."""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
