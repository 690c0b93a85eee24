"""A minimal Django project for tests/db/test_django.py: settings from $DJANGO_TEST_DSN, one app."""
