"""A minimal Django project for tests/test_django.py: settings from $DJANGO_TEST_DSN, one app."""
